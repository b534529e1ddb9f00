"""The agent with a forced failure in the part of a switch that runs after every rank agreed and
the old strategy was let go of (the call `stage_full_state_dict` returns): only a bug could fail
there, so nothing short of a forced failure reaches that path."""


from ringtop.strategies.base import Strategy


def _stage_that_fails_later(self, model_state, optim_state, *, weights_loaded=False):
    def finish() -> None:
        raise RuntimeError("forced failure while writing the state")
    return finish


Strategy.stage_full_state_dict = _stage_that_fails_later

from ringtop.agent.__main__ import main  # noqa: E402
from ringtop.agent.distributed import exit_rank  # noqa: E402

exit_rank(main())

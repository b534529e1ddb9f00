"""The run's state, folded once from its telemetry for every surface: each rank's state
(`rank.py`), the stuck ranks' reports (`hang_board.py`), the run-level readings (`rules.py`) and
the fold itself (`fold.py`), which the Prometheus exporter and `summary` feed and whose parts the
UI's `RunView` is made of. Pure and torch-free."""

from ringtop.metrics.run_state.fold import RunState
from ringtop.metrics.run_state.hang_board import HangBoard
from ringtop.metrics.run_state.rank import MAX_KINDS_PER_RANK, RankState
from ringtop.metrics.run_state.rules import RestartSeen, hang_reading, lifecycle_of, run_ended

__all__ = ["MAX_KINDS_PER_RANK", "HangBoard", "RankState", "RestartSeen", "RunState", "hang_reading",
           "lifecycle_of", "run_ended"]

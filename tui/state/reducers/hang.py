"""Where stuck ranks are, as the UI holds it: the board every surface folds
(metrics/run_state/hang_board.py), named here for the UI's reducers."""

from ringtop.metrics.run_state.hang_board import HANG_EVENT_KINDS, NOTICE_S, HangBoard

__all__ = ["HANG_EVENT_KINDS", "NOTICE_S", "HangBoard"]

"""The view model's parts, each folding what it owns into its own state: the event log, the
operations (commands and their replies), rank 0's verdicts, the stuck ranks' stall reports, the
cross-rank step history, the communication per step. `RunView` routes messages to them and keeps the rank rows."""

from ringtop.tui.state.reducers.commands import (
           CommandLog,
           CommandState,
           command_title,
           describe_result,
           profile_gap,
           status_text,
)
from ringtop.tui.state.reducers.events import EventLine, EventLog
from ringtop.tui.state.reducers.hang import HANG_EVENT_KINDS, HangBoard
from ringtop.tui.state.reducers.verdicts import VERDICT_KINDS, Diagnosis, VerdictBoard, VerdictState

__all__ = ["HANG_EVENT_KINDS", "VERDICT_KINDS", "CommandLog", "CommandState", "Diagnosis", "EventLine", "EventLog",
           "HangBoard", "VerdictBoard", "VerdictState", "command_title", "describe_result", "profile_gap",
           "status_text"]

"""The view model's parts, each folding what it owns into its own state: the event log, the
operations (commands and their replies), rank 0's verdicts, the cross-rank step history, the
communication per step. `RunView` routes messages to them and keeps the rank rows."""

from .commands import CommandLog, CommandState, command_title, describe_result, profile_gap, status_text
from .events import EventLine, EventLog
from .verdicts import VERDICT_KINDS, Diagnosis, VerdictBoard, VerdictState

__all__ = ["VERDICT_KINDS", "CommandLog", "CommandState", "Diagnosis", "EventLine", "EventLog", "VerdictBoard",
           "VerdictState", "command_title", "describe_result", "profile_gap", "status_text"]

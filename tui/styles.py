"""Styles several parts of the screen share, so that the same state looks the same everywhere: an
event's level, an operation's phase."""

LEVEL_STYLE = {"info": "cyan", "warn": "bold yellow", "error": "bold red"}
PHASE_STYLE = {"pending": ("…", "yellow"), "running": ("◐", "bold yellow"), "done": ("✓", "green"),
               "failed": ("✖", "bold red")}

"""What the `ringtop` command prints reaches the terminal inert, and a closed pipe ends it quietly.

Paths, run ids, stop reasons and replies come from files and peers that others may have planted
(a stop reason `\\x1b]2;…\\x07` retitles the terminal, `\\x1b[2J` clears it), so every text write
to stdout and stderr passes through `printable` (protocol/text_safety.py, the UI's rules too):
one place, whatever the printer. Bytes written to `.buffer` pass as they are: that is the ranks'
own output, relayed (colours, progress bars)."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Iterator, TextIO

from ringtop.protocol.text_safety import printable

EXIT_BROKEN_PIPE = 141
"""What a shell reports for a command ended by SIGPIPE (128 + 13), as `cat` in `cat f | head`."""


class SafeText:
    """A text stream whose writes are made printable first; everything else is the stream's."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(printable(text))
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def safe_terminal() -> Iterator[None]:
    """sys.stdout and sys.stderr made safe while the block runs (the UI draws through
    sys.__stderr__ and is not affected)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = SafeText(sys.stdout), SafeText(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def quiet_broken_pipe() -> int:
    """After stdout's reader went away (`ringtop ls | head`): stdout points at /dev/null so the
    interpreter's last flush cannot fail again (Python's documented recipe), no traceback."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return EXIT_BROKEN_PIPE


def one_line_error(verb: str, text: str) -> int:
    """A bad value of a well-formed command line: one line and exit 2, no usage block."""
    print(f"ringtop {verb}: error: {text}", file=sys.stderr)
    return 2

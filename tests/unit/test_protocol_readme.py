"""protocol/README.md says what the code does: every message type (and their number), every error
code any part of ringtop sends, every command, and the limits, each read from the code itself.
A client written from the README alone is the test this stands in for."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ringtop.protocol import COMMANDS, MAX_FRAME_BYTES
from ringtop.protocol.codec import MAX_DEPTH
from ringtop.protocol.errors import ProtocolError
from ringtop.protocol.messages import MESSAGE_TYPES
from ringtop.protocol.rate_limit import BURST, RATE_PER_S, TOTAL_BURST, TOTAL_RATE_PER_S

REPO = Path(__file__).resolve().parents[2]
README = REPO / "protocol" / "README.md"
MiB = 1 << 20


def section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


def documented_types(text: str) -> set[str]:
    return set(re.findall(r"^### `([a-z_]+)`", text, flags=re.M))


def documented_codes(text: str) -> set[str]:
    return set(re.findall(r"^\| `([a-z_]+)` \| (?!meaning \|)", section(text, "## 6. Errors"), flags=re.M))


def codes_in_code() -> set[str]:
    """Every `code` a reply can carry: the decoding errors' own, and every `code="..."` the agent
    and protocol sources pass (found in the sources, so a new one cannot be missed)."""
    codes, todo = set(), [ProtocolError]
    while todo:
        cls = todo.pop()
        codes.add(cls.code)
        todo += cls.__subclasses__()
    for folder in ("agent", "protocol"):
        for path in (REPO / folder).rglob("*.py"):
            codes |= set(re.findall(r"""\bcode=["']([a-z_]+)["']""", path.read_text()))
    return codes


def mismatches(text: str) -> list[str]:
    found = []
    if documented_types(text) != set(MESSAGE_TYPES):
        found.append(f"message headings {sorted(documented_types(text) ^ set(MESSAGE_TYPES))}")
    for where in (r"one of (\S+)\s+\*\*messages\*\*", r"not one of the (\S+) types"):
        said = re.search(where, text)
        if said is None or said.group(1) != str(len(MESSAGE_TYPES)):
            found.append(f"the number of messages: {said and said.group(1)}, not {len(MESSAGE_TYPES)}")
    envelope_types = re.search(r"\| `type` \| str \| \*\*required\*\* \| one of `([a-z_ ]+)`", text)
    if envelope_types is None or set(envelope_types.group(1).split()) != set(MESSAGE_TYPES):
        found.append("the envelope's list of types")
    if documented_codes(text) != codes_in_code():
        found.append(f"error codes {sorted(documented_codes(text) ^ codes_in_code())}")
    commands = set(re.findall(r"^\| `([a-z_]+)` \|", section(text, "## 5. Control messages"), flags=re.M))
    if not set(COMMANDS) <= commands:
        found.append(f"commands {sorted(set(COMMANDS) - commands)}")
    return found


def limits_said(text: str) -> list[str]:
    from ringtop.agent.control.channel import MAX_PENDING_COMMANDS, RECEIVE_HWM, TRANSPORT_MAX_FRAME_BYTES
    from ringtop.agent.transport.ports import BACKLOG, HANDSHAKE_IVL_MS

    limits = section(text, "### Limits on every peer")
    wanted = {
        "largest message": f"**{MAX_FRAME_BYTES // MiB} MiB = {MAX_FRAME_BYTES:,} bytes**",
        "depth": f"nest at most {MAX_DEPTH} levels deep",
        "transport ceiling": f"one over {TRANSPORT_MAX_FRAME_BYTES // MiB} MiB",
        "pending commands": f"waiting for a step boundary ({MAX_PENDING_COMMANDS})",
    }
    missing = [name for name, phrase in wanted.items() if phrase not in text]
    in_table = {
        "handshake": f"| {HANDSHAKE_IVL_MS / 1000:g} s |",
        "backlog": f"| {BACKLOG} |",
        "per peer": f"| burst {BURST}, then {RATE_PER_S:g} a second |",
        "all peers": f"| burst {TOTAL_BURST}, then {TOTAL_RATE_PER_S:g} a second |",
        "silence": f"full again: for {BURST / RATE_PER_S:g} s",
        "held frames": f"| {RECEIVE_HWM} |",
    }
    return missing + [name for name, phrase in in_table.items() if phrase not in limits]


def test_the_readme_lists_every_message_code_and_command_of_the_code():
    assert mismatches(README.read_text()) == []


def test_the_readme_states_the_limits_the_code_enforces():
    pytest.importorskip("torch")  # the control server's module
    assert limits_said(README.read_text()) == []


@pytest.mark.parametrize("damage", [
    lambda t: t.replace("### `digest`", "### digest"),
    lambda t: t.replace(f"one of {len(MESSAGE_TYPES)}", "one of nine"),
    lambda t: t.replace("| `unavailable` |", "| unavailable |"),
    lambda t: t.replace("| `protocol_error` |", "| `ghost_code` | never sent |\n| `protocol_error` |"),
    lambda t: t.replace("stall bye goodput", "stall goodput"),
], ids=["a type", "the count", "a code", "a code the code never sends", "the envelope's list"])
def test_the_readme_check_bites(damage):
    assert mismatches(damage(README.read_text()))


def test_the_limits_check_bites():
    pytest.importorskip("torch")
    text = README.read_text()
    assert limits_said(text.replace("burst 100, then 50 a second", "burst 100, then 60 a second"))
    assert limits_said(text.replace("| 1 s |", "| 30 s |"))

"""What a relay takes from its input, checked before anything is forwarded (agent/transport/relay.py
and node_relay.py): a message that is real (`real`), the topics whose newer message replaces an
older one while a relay is behind (`conflatable`), and a node relay's report of what it skipped."""

from __future__ import annotations

from typing import Collection

import msgspec

from ringtop.protocol import (
    Digest,
    GoodputSoFar,
    Hello,
    Message,
    ProtocolError,
    RankExit,
    RankLook,
    RecentSteps,
    decode,
)
from ringtop.protocol.messages import LOG_ONLY, MESSAGE_TYPES

RELAYS_OWN = (GoodputSoFar, Digest, RecentSteps, RankExit, RankLook)
"""What only the relay (or the watcher holding it) says: dropped when it comes from a rank."""
CONFLATED_TOPICS = (b"step.", b"sample.", b"heartbeat.")
"""What a newer message of the same rank replaces: latest readings, not events. Rank 0's steps are
never skipped (the run's goodput is counted from each of them)."""
SKIPPED_TOPIC = b"skipped.-1"
"""In a node relay's batch: the readings it skipped per rank since its last batch (`skip_report`),
so the head counts them as skipped, not lost."""
_TAGS = {cls: tag for tag, cls in MESSAGE_TYPES.items()}


def conflatable(burst: list[tuple[list[bytes], object]]) -> dict[tuple[bytes, int], tuple[int, int]]:
    """Where each conflatable topic (CONFLATED_TOPICS, but `step.0`) of each sender last occurs in
    the burst, as (message, frame): its earlier occurrences are the ones to skip. By topic alone,
    before any decoding, so a skipped message costs no decode; by sender too, so one connection
    cannot make another's messages skipped (the kept one is checked whole as ever)."""
    last: dict[tuple[bytes, int], tuple[int, int]] = {}
    for at, (frames, sender) in enumerate(burst):
        who = id(sender)
        for i in range(0, len(frames), 2):
            topic = frames[i]
            if topic.startswith(CONFLATED_TOPICS) and topic != b"step.0":
                last[(topic, who)] = (at, i)
    return last


def skip_report(skips: dict[int, int]) -> list[bytes]:
    """A node relay's skipped readings per rank, as the [topic, body] pair that opens its batch."""
    return [SKIPPED_TOPIC, msgspec.msgpack.encode([x for rank_count in skips.items() for x in rank_count])]


def topic_rank(topic: bytes) -> int:
    """The rank a conflatable topic names (`step.12` -> 12); -1 if it names none (then the skip
    is not kept apart from gaps: the message it gave way to is dropped anyway)."""
    try:
        return int(topic[topic.index(b".") + 1:])
    except ValueError:
        return -1


def real_message(frames: list[bytes], sender: Collection[int] | None, run_id: str | None,
                 world_size: int | None) -> Message | None:
    """The message, if it is real (see the module docstring): `sender` the ranks its connection may
    speak for (None: not checked); None otherwise."""
    return real(frames[0], frames[1], sender, run_id, world_size) if len(frames) == 2 else None


def real(topic: bytes, body: bytes, sender: Collection[int] | None, run_id: str | None,
         world_size: int | None) -> Message | None:
    """real_message of one message's two frames."""
    try:
        msg = decode(body)
    except ProtocolError:
        return None
    if topic != f"{_TAGS[type(msg)]}.{msg.rank}".encode():
        return None
    if isinstance(msg, RELAYS_OWN) or (sender is not None and msg.rank not in sender):
        return None  # the relay's own, never a rank's
    if type(msg) in LOG_ONLY:
        return None  # a log's alone (a rank never sends one)
    if world_size is not None and not 0 <= msg.rank < world_size:
        return None
    if isinstance(msg, Hello) and ((run_id is not None and msg.run_id != run_id)
                                   or (world_size is not None and msg.world_size != world_size)):
        return None
    return msg

"""The agent's option values that are not a plain number or word, from their typed text: each
raises ConfigError with the form it expects."""

from __future__ import annotations

from collections.abc import Callable

from ringtop.agent.config.options import ConfigError
from ringtop.metrics.costs.links import parse_link

HANG_PLACES = ("forward", "before-collective", "gil-held")


def slow_rank(text: str) -> tuple[int, float]:
    rank_text, sep, ms_text = text.partition(":")
    try:
        slow = (int(rank_text), float(ms_text))
    except ValueError:
        slow = None
    if not sep or slow is None or slow[0] < 0 or slow[1] < 0:
        raise ConfigError(f"--inject-slow-rank {text!r}: expected R:MS, e.g. 1:200")
    return slow


def _rank_step(flag: str, text: str) -> tuple[int, int, str]:
    """`R:STEP[:EXTRA]` of a fault injection: (rank, step, extra or "")."""
    parts = text.split(":")
    try:
        rank, step = int(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        rank = step = -1
    if len(parts) not in (2, 3) or rank < 0 or step < 1:
        raise ConfigError(f"{flag} {text!r}: expected R:STEP (a rank >= 0, a step >= 1), e.g. 1:5")
    return rank, step, parts[2] if len(parts) == 3 else ""


def hang(text: str) -> tuple[int, int, str]:
    rank, step, place = _rank_step("--inject-hang", text)
    place = place or "forward"
    if place not in HANG_PLACES:
        raise ConfigError(f"--inject-hang {text!r}: the place is one of {', '.join(HANG_PLACES)}")
    return rank, step, place


def at_step(flag: str) -> Callable[[str], tuple[int, int]]:
    """The parser of a fault that takes `R:STEP` and nothing more."""
    def parse(text: str) -> tuple[int, int]:
        rank, step, extra = _rank_step(flag, text)
        if extra:
            raise ConfigError(f"{flag} {text!r}: expected R:STEP, e.g. 1:5")
        return rank, step
    return parse


def layers_per_stage(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"--pp-split {text!r}: expected layer counts like 3,1") from None


def metrics_address(text: str) -> tuple[str, int]:
    host, sep, port_text = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]  # [::1]:9400
    port = int(port_text) if port_text.isdigit() else 0
    if not sep or not host or not 1 <= port <= 65535:
        raise ConfigError(f"--metrics {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9400")
    return host, port


def link_parser(flag: str) -> Callable[[str], float]:
    def peak_gbps(text: str) -> float:
        try:
            return parse_link(text).per_direction_gbps
        except ValueError as exc:
            raise ConfigError(f"{flag}: {exc}") from None
    return peak_gbps


link_peak_gbps = link_parser("--link")


def capture_triggers(text: str) -> tuple[str, ...]:
    """`spike,straggler,stall` (any of them, comma-separated)."""
    from ringtop.agent.control.capture import TRIGGERS

    found = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    unknown = [t for t in found if t not in TRIGGERS]
    if not found or unknown:
        raise ConfigError(f"--capture-on {text!r}: one or more of {', '.join(TRIGGERS)}, comma-separated")
    return found

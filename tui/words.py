"""The words the screen uses for the agent's names: verdict rules, event kinds and evidence keys
are identifiers on the wire (`comm_bound`, `verdict_cleared`, `others_compute_ms`); none of them
is shown as such. One table, so every tab says the same thing for the same name."""

from __future__ import annotations

WORDS: dict[str, str] = {
    # verdict rules (metrics/rules/diagnosis.py)
    "straggler": "straggler",
    "comm_bound": "communication-bound",
    "input_stall": "waiting for input data",
    "memory_pressure": "memory pressure",
    # event kinds (agent, relays, the UI's own)
    "verdict": "verdict",
    "verdict_cleared": "verdict cleared",
    "verdicts_active": "verdicts",
    "operations_recent": "recent operations",
    "nonfinite": "non-finite gradients",
    "prewarm": "warm-up",
    "dump": "black box",
    "insecure": "no encryption",
    "set": "setting",
    "comm": "communication",
    "loss": "loss",
    "auth": "authentication",
    # evidence keys
    "compute_ms": "compute ms",
    "others_compute_ms": "others' compute ms",
    "exposed_comm_share": "exposed comm share",
    "exposed_comm_ms": "exposed comm ms",
    "others_exposed_comm_ms": "others' exposed comm ms",
    "blocked_ms": "exposed comm ms",  # verdicts in logs written before the one name
    "achieved_gbps": "achieved GB/s",
    "link_peak_gbps": "link peak GB/s",
    "ranks_alike": "ranks alike",
    "data_ms": "data wait ms",
    "step_ms": "step ms",
    "reserved_share": "reserved share",
    "alloc_retries": "allocation retries",
}


def words(name: str) -> str:
    """The screen's words for an agent's name; one not in the table loses its underscores."""
    return WORDS.get(name) or name.replace("_", " ")


def at_step(step: int) -> str:
    """`at step 1,204`; a UI that attached after a rank's last step has no number for it (-1)."""
    return f"at step {step:,}" if step >= 0 else "before any step this UI saw"


def in_step(step: int) -> str:
    return f"in step {step:,}" if step >= 0 else "before any step this UI saw"

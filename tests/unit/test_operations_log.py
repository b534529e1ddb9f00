"""Rank 0's operations log (agent/control/operations_log.py): what it keeps and how often it restates it."""

from ringtop.agent.control.operations_log import KEPT, MAX_RESULT_BYTES, OperationsLog
from ringtop.protocol import Reply, encode


def record(log: OperationsLog, reply: Reply) -> None:
    log.record(reply, len(encode(reply)))


def test_keeps_the_latest_operations_with_their_args_and_outcome():
    log = OperationsLog(every_s=5.0)
    assert not log.due(100.0)  # nothing to restate
    record(log, Reply(id="s1", cmd="status", status="done", result={"step": 3}))  # answered at once: not an op
    record(log, Reply(id="c1", cmd="checkpoint", status="ack", result={"args": {"kind": "full"}}))
    record(log, Reply(id="c1", cmd="checkpoint", status="done", result={"path": "/ckpt/step-3", "step": 3}))
    record(log, Reply(id="p1", cmd="profile", status="done", result={"ranks": ["x" * MAX_RESULT_BYTES]}))
    ops = {op["id"]: op for op in log.restatement()["operations"]}
    assert set(ops) == {"c1", "p1"}
    assert ops["c1"]["args"] == {"kind": "full"} and ops["c1"]["status"] == "done"
    assert ops["c1"]["result"] == {"path": "/ckpt/step-3", "step": 3}
    assert ops["p1"]["result"] == {}  # too large to restate every few seconds
    for i in range(KEPT + 3):
        record(log, Reply(id=f"x{i}", cmd="switch", status="error", error="no"))
    kept = [op["id"] for op in log.restatement()["operations"]]
    assert kept == [f"x{i}" for i in range(3, KEPT + 3)]


def test_restates_at_most_once_per_period():
    log = OperationsLog(every_s=5.0)
    record(log, Reply(id="c1", cmd="checkpoint", status="ack"))
    assert log.due(100.0)
    assert not log.due(104.9)
    assert log.due(105.0)

"""Rank 0's services besides training (the head relay, control, Prometheus, the hang watch, the
connection file), as one object the runner, `ringtop.Monitor` and `ringtop simulate` start alike."""

from ringtop.agent.head.services import Head

"""`ringtop simulate`: a run of N ranks without a cluster, for trying and benchmarking the UI at scale.

Everything a UI sees goes the real way: the run's keys (`curve.generate(N)`) and rank 0's
services as the runner starts them, the agent's own `Head` (the `Gatekeeper`, the real `Relay`
with the real hang watch as its observer, a real `ControlServer` answering `status`, the
connection file), so `ringtop ui` and `ringtop ctl` attach with no arguments. Only the ranks are
simulated: each is one XPUB socket in this process, connected to the relay with *that rank's own*
CURVE key pair. The relay names each input connection after the key's rank (ZAP user id) and
drops a message whose rank is not its sender's, so a shared connection carrying several ranks
could not pass honestly: N ranks are N sockets (the context's socket limit is raised; 4096 ranks
need about 3 file descriptors each).

Steps of all ranks advance together on one global step clock at `--hz` (as data-parallel ranks
do), so a UI's lag behind the newest step can be measured; a rank's reported step time is a base
of 70 % of the period with 3 % noise (`--straggler R`: 1.3x that on rank R). Noise comes from a
table drawn once from `--seed`, indexed by (rank, step), so the messages do not depend on timing.

With `--procs 1` (or `--nodes 1`) one process holds the relay and all N ranks, each straight
to the head relay (one GIL): at thousands of ranks on a small machine the simulator and its relay,
not the UI, set the pace. `--rank-procs K` moves ranks 1..N-1 to K worker processes, each rank
still straight to the head relay, which stays here with rank 0 (as real ranks are processes apart
from rank 0's relay). With `--nodes M --procs P` (P > 1; the default is 1 for now) the
run takes the real multi-node path and spreads over P processes: node 0's ranks stay in this one,
publishing to the head relay as node 0's ranks do in a real run, and nodes 1..M-1 go to P - 1
worker processes, each node with a real `NodeRelay` (its node key `RunKeys.for_node`, and the head
letting that key carry exactly that node's ranks) to which its ranks publish over loopback with
their own rank keys. A worker gets its keys and run id on its stdin (never in its argv or
environment, which other users of the node can read), reports its counters on its stdout, starts
stepping on the parent's word, on the same global step clock (a start time shared in wall-clock
time), and ends with its ranks' Byes on the parent's word; it dies with the parent
(PR_SET_PDEATHSIG) and its stdin's end stops it too.

The step rate reached, the messages sent (all processes), what the head relay forwarded and
dropped, and what the node relays lost are in `--status-file` and the closing line; a process
that falls behind the clock publishes its steps late rather than skipping any.

Rooms: `config` (the options, where each rank lives, the result), `scenario` (what each rank
says), `ranks` (their sockets), `head` (rank 0's services), `stepping` (the global step clock),
`run` (the parent process), `worker` (a worker process, both ends of its pipe), `command` (the CLI).
"""

from ringtop.cli.simulate.command import add_arguments, main
from ringtop.cli.simulate.config import SimConfig, SimResult, SimulateError
from ringtop.cli.simulate.run import Simulation
from ringtop.cli.simulate.scenario import STRAGGLER_FACTOR, Scenario

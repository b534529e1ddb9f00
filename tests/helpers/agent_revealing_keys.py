"""The agent, with every key rank 0 makes for its run (the server's secret, each rank's, each node
relay's, the client pair) also written to a file the test names: `agent_revealing_keys.py [agent
options] --keys-out PATH`. The secrets otherwise live only in the ranks' memory, and a test that
greps a bundle for them must know them. PATH is created 0600 and never overwritten."""

import os
import sys

import msgspec

from ringtop.protocol import curve

_at = sys.argv.index("--keys-out")
KEYS_OUT = sys.argv[_at + 1]
del sys.argv[_at:_at + 2]

_generate = curve.generate


def _generate_and_reveal(*args, **kwargs):
    keys = _generate(*args, **kwargs)
    fd = os.open(KEYS_OUT, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(msgspec.json.encode(keys))
    return keys


curve.generate = _generate_and_reveal

from ringtop.agent.__main__ import main  # noqa: E402
from ringtop.agent.distributed import exit_rank  # noqa: E402

exit_rank(main())

"""The agent in a process where `import deepspeed` fails, as on a machine without it."""

import sys

sys.modules["deepspeed"] = None

from ringtop.agent.__main__ import main  # noqa: E402
from ringtop.agent.distributed import exit_rank  # noqa: E402

exit_rank(main())

"""The agent asks PyTorch for transparent huge pages for its large CPU tensors (agent/__init__.py),
and leaves a user's own THP_MEM_ALLOC_ENABLE alone. Checked in a fresh interpreter, on what the
kernel reports for that process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")

PROBE = """
import ringtop.agent
import torch
x = torch.ones(96 << 20 >> 2)  # 96 MB
huge_kb = next(int(line.split()[1]) for line in open("/proc/self/smaps_rollup") if line.startswith("AnonHugePages"))
print(huge_kb)
"""


def _kernel_thp_mode() -> str | None:
    if not THP_MODE.exists() or not Path("/proc/self/smaps_rollup").exists():
        return None
    text = THP_MODE.read_text()
    return text[text.index("[") + 1:text.index("]")]


def _huge_kb(env_value: str | None) -> int:
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    if env_value is not None:
        env["THP_MEM_ALLOC_ENABLE"] = env_value
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.split()[-1])


@pytest.mark.timeout(150)
def test_the_agents_large_cpu_tensors_sit_on_huge_pages_unless_the_user_says_no():
    mode = _kernel_thp_mode()
    if mode != "madvise":
        pytest.skip(f"needs the kernel's transparent huge pages in madvise mode (here: {mode}); "
                    "'always' gives huge pages without asking, 'never' none at all")
    assert _huge_kb(None) >= 64 * 1024, "a 96 MB tensor should be mostly on 2 MB pages"
    assert _huge_kb("0") == 0, "THP_MEM_ALLOC_ENABLE=0 from the user must be kept"

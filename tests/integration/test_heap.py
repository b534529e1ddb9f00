"""`trim_heap` hands memory that freed tensors left in glibc's heap back to the kernel (a switch
relies on it so that the new strategy first touches pages the old one just freed)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from conftest import agent_env

SCRIPT = textwrap.dedent("""
    import torch
    from ringtop.agent.loop.heap import trim_heap

    def rss_bytes():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    torch.ones(4 << 20)  # a freed 16 MB block raises glibc's mmap threshold: smaller ones go to the heap
    blocks = [torch.ones(1 << 20) for _ in range(128)]  # 4 MB each, 512 MB in all
    del blocks[::2]  # holes between live blocks: free() alone cannot hand them back
    held = rss_bytes()
    trimmed = trim_heap()
    print(trimmed, held - rss_bytes())
""")


@pytest.mark.timeout(60)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RSS is read from /proc (Linux)")
def test_memory_freed_into_the_heap_goes_back_to_the_kernel():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=agent_env(), timeout=50)
    assert out.returncode == 0, out.stderr[-3000:]
    trimmed, released = out.stdout.split()
    if trimmed == "False":
        pytest.skip("not glibc: there is no malloc_trim to call")
    assert int(released) >= 200 << 20  # of the 256 MB freed

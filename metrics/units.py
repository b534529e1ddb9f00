"""Byte units. Sizes are shown in binary units everywhere, UI and CLI alike (MiB, GiB: what
allocators and `nvidia-smi` report; metrics.fmt.nbytes); rates in decimal MB/s and GB/s (nccl-tests'
GB/s, link speeds). The cost model's docstrings check the chapter's decimal GB by hand."""

from __future__ import annotations

GB = 1e9
MB = 1e6
MIB = 1 << 20
GIB = 1 << 30

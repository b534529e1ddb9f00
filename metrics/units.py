"""Byte units. Rates and sizes shown as GB or MB are decimal (the chapter's "7B x 2 bytes = 14 GB",
nccl-tests' GB/s); memory is shown in binary units (what allocators and `nvidia-smi` report)."""

from __future__ import annotations

GB = 1e9
MB = 1e6
GIB = 1 << 30

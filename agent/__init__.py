"""The per-rank agent: `torchrun --nproc_per_node=N -m ringtop.agent [options]`.

Importing it asks PyTorch to back large CPU tensors with transparent huge pages
(`THP_MEM_ALLOC_ENABLE=1`, read at the first CPU allocation), unless the environment already says
otherwise. A live switch or a checkpoint's staging copy allocates hundreds of MB at once; with 4 KB
pages the page faults, not the copying, were most of a 125m switch to ZeRO-2 on the CPU machines
(see benchmarks/README.md). Set THP_MEM_ALLOC_ENABLE=0 to keep PyTorch's default.
"""

import os

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

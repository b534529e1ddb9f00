"""Dense peak TFLOP/s per accelerator and compute dtype: what MFU divides by.

Every figure is the vendor's dense (no structured sparsity) tensor-core peak for that dtype —
datasheets print the 2:4 sparsity figure first, twice the dense one, marked with an asterisk —
and `fp32` is the plain (non-tensor-core) FP32 rate, what an fp32 run gets unless TF32 matmuls are
switched on. Each row names its source. A device not in the table has no peak: `match_device`
and `peak_for` return None, never a neighbour's figure (an unknown GPU read against A100's peak is
how MFUs of 150–560 % come about). `--peak-tflops` overrides the table.

Devices are recognised by their NVML name (`nvmlDeviceGetName`; on ROCm, torch's device name,
which is the same string `rocm-smi` shows).

Stdlib only, like the rest of `ringtop.metrics`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

DTYPES = ("fp8", "bf16", "fp16", "tf32", "fp32")


@dataclass(frozen=True)
class Accelerator:
    name: str
    pattern: str
    """A regular expression (case-insensitive) its NVML names match and no other row's do."""
    tflops: dict[str, float]
    """Dense peak TFLOP/s per compute dtype (DTYPES); a dtype it has no tensor cores for is absent."""
    source: str
    _regex: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_regex", re.compile(self.pattern, re.IGNORECASE))
        unknown = set(self.tflops) - set(DTYPES)
        if unknown or any(not v > 0 for v in self.tflops.values()):
            raise ValueError(f"{self.name}: dtypes {sorted(unknown)} or a peak <= 0")

    def matches(self, device_name: str) -> bool:
        return self._regex.search(device_name) is not None


_HOPPER_SXM = {"fp8": 1979.0, "bf16": 989.0, "fp16": 989.0, "tf32": 494.5, "fp32": 67.0}
_HOPPER_NVL = {"fp8": 1670.5, "bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}
_AMPERE_A100 = {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}
_A100_SOURCE = ("NVIDIA A100 Tensor Core GPU datasheet, https://www.nvidia.com/content/dam/en-zz/Solutions/"
                "Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf")
_H100_SOURCE = "NVIDIA H100 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h100/"
_H200_SOURCE = "NVIDIA H200 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h200/"
_CDNA3 = {"fp8": 2614.9, "bf16": 1307.4, "fp16": 1307.4, "tf32": 653.7, "fp32": 163.4}

ACCELERATORS: tuple[Accelerator, ...] = (
    Accelerator("V100 SXM2", r"\bV100[- ]?SXM2", {"fp16": 125.0, "fp32": 15.7},
                "NVIDIA Tesla V100 datasheet, https://images.nvidia.com/content/technologies/volta/pdf/"
                "tesla-volta-v100-datasheet-letter-fnl-web.pdf"),
    Accelerator("V100 PCIe", r"\bV100[- ]?PCIE", {"fp16": 112.0, "fp32": 14.0},
                "NVIDIA Tesla V100 datasheet, https://images.nvidia.com/content/technologies/volta/pdf/"
                "tesla-volta-v100-datasheet-letter-fnl-web.pdf"),
    Accelerator("A100 SXM", r"\bA100[- ]?SXM", _AMPERE_A100, _A100_SOURCE),
    Accelerator("A100 PCIe", r"\bA100\b.*\bPCIE\b", _AMPERE_A100, _A100_SOURCE),
    Accelerator("A10", r"\bA10\b", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2},
                "NVIDIA A10 Tensor Core GPU datasheet, https://www.nvidia.com/content/dam/en-zz/Solutions/"
                "Data-Center/a10/pdf/a10-datasheet.pdf"),
    Accelerator("L4", r"\bL4\b", {"fp8": 242.5, "bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3},
                "NVIDIA L4 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/l4/"),
    Accelerator("L40", r"\bL40\b", {"fp8": 362.0, "bf16": 181.0, "fp16": 181.0, "tf32": 90.5, "fp32": 90.5},
                "NVIDIA L40 GPU datasheet, https://www.nvidia.com/en-us/data-center/l40/"),
    Accelerator("L40S", r"\bL40S\b", {"fp8": 733.0, "bf16": 366.0, "fp16": 366.0, "tf32": 183.0, "fp32": 91.6},
                "NVIDIA L40S GPU datasheet, https://www.nvidia.com/en-us/data-center/l40s/"),
    Accelerator("H100 SXM", r"\bH100\b.*\b(SXM\w*|HBM3\w*)\b", _HOPPER_SXM, _H100_SOURCE),
    Accelerator("H100 PCIe", r"\bH100\b.*\bPCIE\b",
                {"fp8": 1513.0, "bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.0}, _H100_SOURCE),
    Accelerator("H100 NVL", r"\bH100\s+NVL\b", _HOPPER_NVL, _H100_SOURCE),
    Accelerator("H200", r"\bH200\b(?!\s+NVL)", _HOPPER_SXM, _H200_SOURCE + " (H200 SXM)"),
    Accelerator("H200 NVL", r"\bH200\s+NVL\b", _HOPPER_NVL, _H200_SOURCE + " (H200 NVL)"),
    Accelerator("GH200", r"\bGH200\b", _HOPPER_SXM,
                "NVIDIA GH200 Grace Hopper Superchip datasheet, "
                "https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/"),
    Accelerator("B200", r"\bB200\b", {"fp8": 4500.0, "bf16": 2250.0, "fp16": 2250.0, "tf32": 1125.0, "fp32": 75.0},
                "NVIDIA HGX B200 datasheet (8-GPU figures / 8), https://www.nvidia.com/en-us/data-center/hgx/"),
    Accelerator("MI250X", r"\bMI250X\b(?!\s*/)", {"bf16": 383.0, "fp16": 383.0, "fp32": 95.7},
                "AMD Instinct MI250X datasheet, https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html"),
    Accelerator("MI300X", r"\bMI300X\b", _CDNA3,
                "AMD Instinct MI300X datasheet, https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html"),
    Accelerator("MI325X", r"\bMI325X\b", _CDNA3,
                "AMD Instinct MI325X datasheet, https://www.amd.com/en/products/accelerators/instinct/mi300/mi325x.html"),
)


def match_device(device_name: str) -> Accelerator | None:
    """The table's row for an NVML device name; None unless exactly one row matches."""
    found = [a for a in ACCELERATORS if a.matches(device_name)]
    return found[0] if len(found) == 1 else None


def compute_dtype(dtype: str, tf32_matmul: bool = False) -> str:
    """The peak a run is held to: its compute dtype, fp32 read as tf32 where fp32 matmuls run on
    TF32 tensor cores (torch's float32 matmul precision `high` or `medium`)."""
    if dtype in ("fp32", "float32"):
        return "tf32" if tf32_matmul else "fp32"
    return {"bfloat16": "bf16", "float16": "fp16", "half": "fp16"}.get(dtype, dtype)


@dataclass(frozen=True)
class Peak:
    tflops: float
    """0.0: not known (MFU n/a)."""
    source: str
    """Where the figure is from, or why there is none: what the UI shows beside MFU."""


def resolve_peak(device_name: str, dtype: str, override_tflops: float = 0.0) -> Peak:
    """The peak MFU divides by: `--peak-tflops` when given, else the table's row for this device
    and dtype, else none (0.0) with the reason."""
    if override_tflops > 0:
        return Peak(override_tflops, "--peak-tflops")
    if not device_name:
        return Peak(0.0, "no accelerator; pass --peak-tflops")
    row = match_device(device_name)
    if row is None:
        return Peak(0.0, f"unknown device {device_name}")
    tflops = row.tflops.get(dtype)
    if tflops is None:
        return Peak(0.0, f"{row.name} has no {dtype} peak")
    return Peak(tflops, f"{row.name} {dtype} dense, {row.source}")


CPU_TFLOPS_PER_CORE: dict[str, float] = {"fp32": 0.3, "tf32": 0.3, "bf16": 4.2, "fp16": 4.2, "fp8": 4.2}
"""The most one CPU core could do, generously: fp32 with AVX-512 is 2 FMA units × 16 lanes × 2 FLOPs
× 4.7 GHz ≈ 0.30 TFLOP/s; bf16 / fp16 with Intel AMX 1,024 FLOPs per cycle × 4.1 GHz ≈ 4.2. A
figure above cores × this is not a CPU's: the tokens or FLOPs it was computed from are wrong."""


def tflops_ceiling(peak: Peak, accelerator: str, dtype: str, cpu_cores: int) -> Peak:
    """The most TFLOP/s a rank could achieve, to hold its figures against: the device's dense peak
    for its dtype (the peak MFU divides by), or on CPU `cpu_cores` × CPU_TFLOPS_PER_CORE; 0.0
    (nothing to hold against) on an accelerator whose peak is not known."""
    if peak.tflops > 0:
        return Peak(peak.tflops, f"the dense {dtype} peak ({peak.source})")
    if accelerator or cpu_cores <= 0:
        return Peak(0.0, "")
    per_core = CPU_TFLOPS_PER_CORE.get(dtype, CPU_TFLOPS_PER_CORE["fp32"])
    return Peak(cpu_cores * per_core, f"what {cpu_cores} CPU core{'s' if cpu_cores != 1 else ''} can do "
                                      f"at {dtype} ({per_core:g} TFLOP/s each at most)")


def implausible(tflops: float, ceiling_tflops: float) -> bool:
    """A figure above the most its device could do is not a measurement: its FLOPs or tokens are
    wrong. Never with no ceiling known."""
    return ceiling_tflops > 0 and tflops > ceiling_tflops

"""Host and GPU readings on a thread of their own: psutil always, NVML where a GPU is present.

NVML also gives the link counters the diagnosis needs to judge a link: PCIe TX/RX throughput with
the link's generation and width, and NVLink data counters (cumulative KiB per link, turned into a
rate between samples).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

from ringtop.protocol import GpuSample, Sample
from ringtop.protocol.guard import LoopFaults


def open_nvml(device_index: int):
    try:
        import pynvml
    except ImportError:
        return None, None
    try:
        pynvml.nvmlInit()
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(device_index)
    except Exception:
        return None, None


def _text(name: Any) -> str:
    return name.decode() if isinstance(name, bytes) else str(name)


def device_name(device_index: int, nvml: Any = None, handle: Any = None,
                torch_name: Callable[[int], str] | None = None) -> str:
    """The accelerator's name as NVML gives it ("NVIDIA H100 80GB HBM3"), read once at start for
    the peak table; torch's name where NVML is not there (ROCm, no pynvml); "" when neither says."""
    if nvml is None:
        nvml, handle = open_nvml(device_index)
    if nvml is not None:
        try:
            return _text(nvml.nvmlDeviceGetName(handle)).strip()
        except Exception:
            pass
    if torch_name is None:
        import torch

        torch_name = torch.cuda.get_device_name
    try:
        return str(torch_name(device_index)).strip()
    except Exception:
        return ""


class GpuReader:
    """Reads one GPU through an NVML module (`pynvml`, or a stand-in in tests)."""

    def __init__(self, nvml: Any, handle: Any, index: int):
        self.nvml, self.handle, self.index = nvml, handle, index
        self.links = self._call(lambda: self._field_values([nvml.NVML_FI_DEV_NVLINK_LINK_COUNT])[0], 0) or 0
        self.nvlink_version = self._call(lambda: nvml.nvmlDeviceGetNvLinkVersion(handle, 0), 0) if self.links else 0
        self._last_nvlink: tuple[float, int, int] | None = None

    def _call(self, fn: Callable[[], Any], default: Any) -> Any:
        try:
            return fn()
        except Exception:
            return default

    def _field_values(self, fields: list[Any]) -> list[int | None]:
        values = self.nvml.nvmlDeviceGetFieldValues(self.handle, fields)
        return [int(v.value.ullVal) if v.nvmlReturn == 0 else None for v in values]

    def _nvlink_totals_kib(self) -> tuple[int, int] | None:
        nvml = self.nvml
        fields = [(f, link) for link in range(self.links)
                  for f in (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)]
        values = self._call(lambda: self._field_values(fields), None)
        if not values or any(v is None for v in values):
            return None
        return sum(values[0::2]), sum(values[1::2])

    def read(self) -> GpuSample | None:
        nvml, handle = self.nvml, self.handle
        try:
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            util = nvml.nvmlDeviceGetUtilizationRates(handle)
            name = nvml.nvmlDeviceGetName(handle)
        except Exception:
            return None
        sample = GpuSample(
            index=self.index, name=_text(name),
            util_percent=float(util.gpu), mem_used_bytes=int(mem.used), mem_total_bytes=int(mem.total),
            power_w=self._call(lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0, 0.0),
            temperature_c=float(self._call(
                lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU), 0)),
            pcie_tx_bytes_per_s=1024.0 * self._call(
                lambda: nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_TX_BYTES), 0),
            pcie_rx_bytes_per_s=1024.0 * self._call(
                lambda: nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_RX_BYTES), 0),
            pcie_generation=self._call(lambda: nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle), 0),
            pcie_width=self._call(lambda: nvml.nvmlDeviceGetCurrPcieLinkWidth(handle), 0),
            nvlink_links=self.links, nvlink_version=self.nvlink_version,
        )
        totals = self._nvlink_totals_kib() if self.links else None
        now = time.monotonic()
        if totals is not None:
            if self._last_nvlink is not None:
                t0, tx0, rx0 = self._last_nvlink
                dt = now - t0
                if dt > 0:
                    sample.nvlink_tx_bytes_per_s = 1024.0 * max(0, totals[0] - tx0) / dt
                    sample.nvlink_rx_bytes_per_s = 1024.0 * max(0, totals[1] - rx0) / dt
            self._last_nvlink = (now, *totals)
        return sample


class SystemSampler(threading.Thread):
    def __init__(self, emit: Callable[[Sample], None], interval_s: float = 1.0, gpu_index: int | None = None):
        super().__init__(name="ringtop-sampler", daemon=True)
        self._emit = emit
        self._interval_s = interval_s
        self._gpu_index = gpu_index
        self._stop_event = threading.Event()
        self._process = psutil.Process()
        self._process.cpu_percent(None)
        self.latest = Sample()
        self.faults = LoopFaults("sampler")

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        gpu = None
        if self._gpu_index is not None:
            nvml, handle = open_nvml(self._gpu_index)
            if nvml is not None:
                gpu = GpuReader(nvml, handle, self._gpu_index)
        while not self._stop_event.wait(self._interval_s):
            try:
                sample = Sample(cpu_percent=self._process.cpu_percent(None),
                                rss_bytes=self._process.memory_info().rss)
                if gpu is not None:
                    sample.gpu = gpu.read()
                self.latest = sample
                self._emit(sample)
            except Exception as exc:  # /proc unreadable (EMFILE under a connection flood): the next one
                self.faults.record(exc)

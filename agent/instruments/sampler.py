"""Host and GPU readings on a thread of their own: psutil always, NVML where a GPU is present."""

from __future__ import annotations

import threading
from collections.abc import Callable

import psutil

from ringtop.protocol import GpuSample, Sample


def _open_nvml(device_index: int):
    try:
        import pynvml
    except ImportError:
        return None, None
    try:
        pynvml.nvmlInit()
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(device_index)
    except Exception:
        return None, None


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

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        nvml, handle = _open_nvml(self._gpu_index) if self._gpu_index is not None else (None, None)
        while not self._stop_event.wait(self._interval_s):
            sample = Sample(cpu_percent=self._process.cpu_percent(None), rss_bytes=self._process.memory_info().rss)
            if nvml is not None:
                sample.gpu = _gpu_sample(nvml, handle, self._gpu_index)
            self.latest = sample
            self._emit(sample)


def _gpu_sample(nvml, handle, index: int) -> GpuSample | None:
    try:
        mem = nvml.nvmlDeviceGetMemoryInfo(handle)
        util = nvml.nvmlDeviceGetUtilizationRates(handle)
        name = nvml.nvmlDeviceGetName(handle)
        return GpuSample(
            index=index,
            name=name.decode() if isinstance(name, bytes) else str(name),
            util_percent=float(util.gpu),
            mem_used_bytes=int(mem.used),
            mem_total_bytes=int(mem.total),
            power_w=nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            temperature_c=float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
        )
    except Exception:
        return None

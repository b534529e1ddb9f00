"""The sampler thread, for real on this host; its NVML reading against a stand-in NVML module
(no GPU here), named as such."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from ringtop.agent.instruments.sampler import GpuReader, SystemSampler


def test_the_sampler_thread_reports_this_process_cpu_and_rss():
    got: list = []
    sampler = SystemSampler(got.append, interval_s=0.05)
    sampler.start()
    deadline = time.monotonic() + 5
    while len(got) < 3 and time.monotonic() < deadline:
        sum(i * i for i in range(20000))
    sampler.stop()
    sampler.join(2)
    assert len(got) >= 3 and all(s.rss_bytes > 10_000_000 for s in got)
    assert sampler.latest is got[-1] and not sampler.is_alive()
    assert threading.current_thread() is threading.main_thread()


class FakeNvml:
    """Stand-in for pynvml (mock: no GPU on this machine): 2 NVLinks, counters in KiB."""

    NVML_FI_DEV_NVLINK_LINK_COUNT = 91
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1
    NVML_TEMPERATURE_GPU = 0

    def __init__(self):
        self.kib = {138: [0, 0], 139: [0, 0]}

    def nvmlDeviceGetFieldValues(self, handle, fields):
        out = []
        for field in fields:
            fid, link = field if isinstance(field, tuple) else (field, 0)
            value = 2 if fid == 91 else self.kib[fid][link]
            out.append(SimpleNamespace(nvmlReturn=0, value=SimpleNamespace(ullVal=value)))
        return out

    def nvmlDeviceGetNvLinkVersion(self, handle, link):
        return 4

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=30 * 2**30, total=80 * 2**30)

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=97)

    def nvmlDeviceGetName(self, handle):
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetPowerUsage(self, handle):
        return 650_000

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 61

    def nvmlDeviceGetPcieThroughput(self, handle, counter):
        return 2000 if counter == 0 else 1000  # KB/s

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle):
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle):
        return 16


def test_gpu_reading_turns_nvlink_counters_into_rates_with_fake_nvml():
    nvml = FakeNvml()
    reader = GpuReader(nvml, handle=object(), index=3)
    first = reader.read()
    assert first.nvlink_links == 2 and first.nvlink_version == 4 and first.nvlink_tx_bytes_per_s == 0
    assert (first.pcie_generation, first.pcie_width) == (5, 16)
    assert first.pcie_tx_bytes_per_s == 2000 * 1024 and first.mem_total_bytes == 80 * 2**30
    assert first.power_w == 650.0 and first.name == "NVIDIA H100 80GB HBM3"
    nvml.kib[138] = [1000, 3000]  # 4000 KiB sent over both links since the first read
    nvml.kib[139] = [500, 500]
    reader._last_nvlink = (reader._last_nvlink[0] - 2.0, *reader._last_nvlink[1:])  # as if 2 s ago
    second = reader.read()
    assert abs(second.nvlink_tx_bytes_per_s - 4000 * 1024 / 2.0) / (4000 * 1024 / 2.0) < 0.01
    assert abs(second.nvlink_rx_bytes_per_s - 1000 * 1024 / 2.0) / (1000 * 1024 / 2.0) < 0.01

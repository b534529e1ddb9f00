"""FLOPs per token, achieved TFLOP/s, the peak table and MFU (ringtop.metrics.costs.flops / peaks,
ringtop.agent.models.flop_count), each against an independent reference: torch's flop counter, the
vendors' figures written out here, arithmetic done by hand."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from ringtop.agent.instruments.sampler import device_name
from ringtop.agent.models.flop_count import counted_flops_per_token, meta_copy, tiny_gpt_flops_per_token
from ringtop.agent.models.model import MODEL_SIZES, build_tiny_gpt, count_params
from ringtop.metrics.costs.flops import achieved_tflops, mfu, transformer_flops_per_token, within
from ringtop.metrics.rules.peaks import ACCELERATORS, compute_dtype, match_device, resolve_peak


@functools.cache
def tiny_gpt(size: str) -> nn.Module:
    return build_tiny_gpt(size, 0)


def counter_flops_per_token(size: str, batch: int, seq_len: int) -> float:
    """The reference: torch's flop counter over one forward and backward of the built-in model, on
    the meta device (shapes only), per token."""
    model = meta_copy(tiny_gpt(size))
    x = torch.randint(0, MODEL_SIZES[size].vocab_size, (batch, seq_len), device="meta")
    with FlopCounterMode(display=False) as counter:
        model(x, x).backward()
    return counter.get_total_flops() / (batch * seq_len)


@pytest.mark.parametrize("size", list(MODEL_SIZES))
@pytest.mark.parametrize("seq_len", [64, 512])
def test_the_formula_is_within_10_percent_of_torchs_flop_counter_on_the_built_in_models(size, seq_len):
    formula = tiny_gpt_flops_per_token(tiny_gpt(size), seq_len).flops
    assert within(formula, counter_flops_per_token(size, 2, seq_len), 0.10)


def test_the_check_fails_a_formula_with_2n_instead_of_6n():
    model = tiny_gpt("1m")
    cfg = model.cfg
    n = count_params(model) - model.pos_emb.weight.numel()
    wrong = 2 * n + 12 * cfg.n_layer * cfg.d_model * 128  # forward only: a third of the work
    assert not within(wrong, counter_flops_per_token("1m", 2, 128), 0.10)
    without_attention = 6 * n  # at a long sequence the attention term is a large share
    assert not within(without_attention, counter_flops_per_token("1m", 1, 1024), 0.10)


def test_the_formula_by_hand():
    # 6 x 1000 + 12 x 2 layers x 64 hidden x 32 tokens
    assert transformer_flops_per_token(1000, 2, 64, 32) == 6000 + 49152
    with pytest.raises(ValueError):
        transformer_flops_per_token(-1, 2, 64, 32)


class Regression(nn.Module):
    def __init__(self):
        super().__init__()
        self.m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x, y):
        return nn.functional.mse_loss(self.m(x), y)


def test_any_module_is_counted_once_on_a_meta_copy_and_its_weights_are_untouched():
    torch.manual_seed(0)
    model = Regression()
    before = [p.detach().clone() for p in model.parameters()]
    got = counted_flops_per_token(meta_copy(model), (torch.randn(8, 16), torch.randn(8, 4)))
    # per row: forward 2 x 16 x 32 and 2 x 32 x 4; backward both weights' gradients and the second
    # layer's input gradient (the first layer's input needs none). Tokens: the inputs' elements.
    per_row = 2 * 16 * 32 * 2 + 2 * 32 * 4 * 3
    assert got.source == "counted"
    assert got.flops == 8 * per_row / (8 * 16)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None and p.device.type == "cpu" for p in model.parameters())


def test_a_module_the_counter_cannot_run_is_not_counted_and_says_why():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Linear(4, 4)

        def forward(self, x):
            out = self.w(x).sum()
            if out.item() > 0:  # data-dependent: a meta tensor has no value
                return out
            return -out

    got = counted_flops_per_token(meta_copy(Branchy()), torch.randn(2, 4))
    assert got.flops == 0.0 and got.source.startswith("not counted")


def test_achieved_tflops_and_mfu_by_hand():
    # 1e9 FLOPs per token x 4096 tokens in 0.5 s = 8.192e12 FLOP/s
    assert achieved_tflops(1e9, 4096, 500.0) == pytest.approx(8.192)
    assert achieved_tflops(0.0, 4096, 500.0) == 0.0
    assert achieved_tflops(1e9, 4096, 0.0) == 0.0
    assert mfu(8.192, 989.0) == pytest.approx(8.192 / 989.0)
    assert mfu(8.192, 0.0) is None


NVML_NAMES = [
    # (NVML's name, the row, bf16 dense TFLOP/s from the vendor's datasheet: sparsity figure / 2)
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.0),
    ("NVIDIA H100 PCIe", "H100 PCIe", 756.5),
    ("NVIDIA H100 NVL", "H100 NVL", 835.5),
    ("NVIDIA H200", "H200", 989.0),
    ("NVIDIA H200 NVL", "H200 NVL", 835.5),
    ("NVIDIA GH200 480GB", "GH200", 989.0),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM", 312.0),
    ("NVIDIA A100-SXM4-40GB", "A100 SXM", 312.0),
    ("NVIDIA A100-PCIE-40GB", "A100 PCIe", 312.0),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe", 312.0),
    ("NVIDIA B200", "B200", 2250.0),
    ("NVIDIA L40S", "L40S", 366.0),
    ("NVIDIA L40", "L40", 181.0),
    ("NVIDIA L4", "L4", 121.0),
    ("NVIDIA A10", "A10", 125.0),
    ("AMD Instinct MI300X", "MI300X", 1307.4),
    ("AMD Instinct MI325X", "MI325X", 1307.4),
]


@pytest.mark.parametrize("name, row, bf16", NVML_NAMES)
def test_each_known_nvml_name_maps_to_its_row(name, row, bf16):
    found = match_device(name)
    assert found is not None and found.name == row
    peak = resolve_peak(name, "bf16")
    assert peak.tflops == bf16
    assert row in peak.source and "datasheet" in peak.source


@pytest.mark.parametrize("name", ["NVIDIA GeForce RTX 4090", "NVIDIA A10G", "NVIDIA GB200", "Tesla T4",
                                  "NVIDIA H800", "NVIDIA H100", "AMD Instinct MI250X/MI250", "something new"])
def test_an_unknown_device_has_no_peak_never_a_fallback(name):
    assert match_device(name) is None
    peak = resolve_peak(name, "bf16")
    assert peak.tflops == 0.0 and peak.source == f"unknown device {name}"


def test_every_row_has_a_source_and_only_its_own_names_match():
    for a in ACCELERATORS:
        assert "http" in a.source, a.name
    for name, row, _ in NVML_NAMES:
        assert [a.name for a in ACCELERATORS if a.matches(name)] == [row]


def test_peak_tflops_overrides_the_table_and_a_cpu_has_none_without_it():
    assert resolve_peak("NVIDIA H100 80GB HBM3", "bf16", 500.0).tflops == 500.0
    assert resolve_peak("unknown thing", "bf16", 42.0).source == "--peak-tflops"
    cpu = resolve_peak("", "fp32")
    assert cpu.tflops == 0.0 and "--peak-tflops" in cpu.source
    assert resolve_peak("", "fp32", 2.5).tflops == 2.5


def test_the_dtype_held_to_fp32_is_tf32_only_where_matmuls_run_on_tf32():
    assert compute_dtype("fp32") == "fp32"
    assert compute_dtype("fp32", tf32_matmul=True) == "tf32"
    assert compute_dtype("bf16", tf32_matmul=True) == "bf16"
    assert resolve_peak("NVIDIA A100-SXM4-80GB", "fp32").tflops == 19.5
    assert resolve_peak("NVIDIA A100-SXM4-80GB", "tf32").tflops == 156.0
    v100 = resolve_peak("Tesla V100-SXM2-32GB", "bf16")  # no bf16 tensor cores
    assert v100.tflops == 0.0 and "no bf16" in v100.source


class NamingNvml:
    """Stand-in for pynvml (mocked: no GPU and no NVML on this machine)."""

    def __init__(self, name):
        self.name = name

    def nvmlDeviceGetName(self, handle):
        if isinstance(self.name, Exception):
            raise self.name
        return self.name


def test_device_name_from_a_mocked_nvml_finds_the_peak():
    name = device_name(0, NamingNvml(b"NVIDIA H100 80GB HBM3"), SimpleNamespace())
    assert name == "NVIDIA H100 80GB HBM3"
    assert resolve_peak(name, "bf16").tflops == 989.0


def test_device_name_with_a_mocked_failing_nvml_falls_back_to_torchs_name():
    name = device_name(1, NamingNvml(RuntimeError("NVML gone")), None, torch_name=lambda i: "AMD Instinct MI300X")
    assert name == "AMD Instinct MI300X"
    assert device_name(1, NamingNvml(RuntimeError("x")), None, torch_name=lambda i: 1 / 0) == ""

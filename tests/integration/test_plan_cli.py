"""`ringtop plan` as a user runs it: a subprocess, its table, its JSON, its errors, and no torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ringtop.cli", "plan", *args],
                          capture_output=True, text=True, timeout=60)


def rows_of(table: str) -> dict[str, list[str]]:
    """First-column name -> the remaining cells, for every table row (first occurrence wins)."""
    out: dict[str, list[str]] = {}
    for line in table.splitlines():
        cells = line.split()
        if cells and cells[0] not in out:
            out[cells[0]] = cells[1:]
    return out


def gib(decimal_gb: float) -> str:
    """The chapter's decimal GB as the UI shows sizes (binary, one decimal under 100 GiB)."""
    v = decimal_gb * 1e9 / 2**30
    return f"{v:.1f}GiB" if v < 100 else f"{v:.0f}GiB"


def test_chapter_state_model_shows_the_chapters_memory_table_in_binary_units():
    # chapter 11.3, 7B (15.2 GB of bf16 params = 7.6e9 params), 8 ranks, optimizer 4 x 2 = 8 bytes/param
    res = plan("--params", "7.6e9", "--ranks", "8", "--state-model", "chapter")
    assert res.returncode == 0, res.stderr
    memory_table = res.stdout.split("Communication")[0]
    rows = rows_of(memory_table)
    #                 params grads optimizer total
    assert rows["ddp"][:4] == [gib(15.2), gib(15.2), gib(60.8), gib(91.2)]  # the chapter's parts; it says "~95"
    assert rows["zero1"][:4] == [gib(15.2), gib(15.2), gib(7.6), gib(38.0)]
    assert rows["zero2"][:4] == [gib(15.2), gib(1.9), gib(7.6), gib(24.7)]
    assert rows["zero3"][:4] == [gib(1.9), gib(1.9), gib(7.6), gib(11.4)]
    assert rows["ddp"][4].startswith("no")  # 91.2 GB > 80 GB default
    assert rows["zero1"][4] == "yes"
    assert "binary units" in res.stdout and "per direction" in res.stdout
    assert "4 × param bytes (8 B/param), the model of the ZeRO chapter of distributed-training-basics.zh.txt" \
        in res.stdout  # which model, in words


def test_default_rows_use_each_implementations_optimizer_state():
    """7B on 8 ranks, bf16: ZeRO-3 as DeepSpeed holds it, (2 + 2 + 12) x 7e9 / 8 = 14 GB (not the
    chapter's 8 B/param, 10.5 GB); DDP as torch holds it, fp32 params and grads + AdamW's two fp32
    moments, 16 x 7e9 = 112 GB; each row says which optimizer-state model it used."""
    data = json.loads(plan("--params", "7e9", "--ranks", "8", "--json").stdout)
    rows = {r["strategy"]: r for r in data["strategies"]}
    assert data["state_model"] == "implementation"
    assert rows["zero3"]["memory"]["total_bytes"] == 14_000_000_000
    assert rows["ddp"]["memory"]["total_bytes"] == 112_000_000_000
    assert [rows[s]["optimizer_state"]["bytes_per_param"] for s in ("ddp", "zero1", "zero3", "fsdp-full")] == \
        [8, 12, 12, 8]
    assert (rows["fsdp-grad-op"]["sharded"], rows["zero1"]["sharded"], rows["ddp"]["sharded"]) == \
        ("grads+optim", "optim", "-")
    table = rows_of(plan("--params", "7e9", "--ranks", "8").stdout.split("Communication")[0])
    assert table["zero3"][3] == gib(14.0) and table["ddp"][3] == gib(112.0)
    # the chapter's model gives the other number, so the default is not it
    chapter = json.loads(plan("--params", "7e9", "--ranks", "8", "--state-model", "chapter", "--json").stdout)
    assert next(r for r in chapter["strategies"] if r["strategy"] == "zero3")["memory"]["total_bytes"] == \
        10_500_000_000


def test_table_shows_chapter_comm_times_and_overheads():
    # chapter 11.1: 7B bf16, 8 GPUs: all-reduce 24.5 GB per rank; NVLink ~0.05 s (2.5 %), PCIe ~0.8 s (30 %+)
    chapter = ("--params", "7e9", "--ranks", "8", "--state-model", "chapter")
    nv = rows_of(plan(*chapter, "--link", "nvlink4").stdout.split("Communication")[1])
    pc = rows_of(plan(*chapter, "--link", "pcie4").stdout.split("Communication")[1])
    # all-reduce, reduce-scatter, all-gather, total, comm s, overhead %
    assert nv["ddp"] == [gib(24.5), "-", "-", gib(24.5), "0.0544", "2.7"]  # 24.5/450 s; /2 s
    assert pc["ddp"] == [gib(24.5), "-", "-", gib(24.5), "0.766", "38.3"]  # 24.5/32 s;  /2 s
    # ZeRO-3: 12.25 GB reduce-scatter + 24.5 GB all-gather = 36.75 GB, 1.5x DDP
    assert nv["zero3"][1:3] == [gib(12.25), gib(24.5)]
    assert nv["zero3"][3] == gib(36.75)


def test_json_contains_the_same_numbers():
    res = plan("--params", "7.6e9", "--ranks", "8", "--state-model", "chapter", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    totals = {r["strategy"]: r["memory"]["total_bytes"] for r in data["strategies"]}
    # chapter: 91.2 (15.2+15.2+60.8) / 38 / 24.7 / 11.4 GB
    assert totals["ddp"] == 91_200_000_000
    assert totals["zero1"] == 38_000_000_000
    assert totals["zero2"] == 24_700_000_000
    assert totals["zero3"] == 11_400_000_000
    ddp = next(r for r in data["strategies"] if r["strategy"] == "ddp")
    # 2 x 7/8 x 15.2 GB = 26.6 GB all-reduced per rank
    assert ddp["comm"]["by_kind"] == {"all_reduce": {"payload_bytes": 15_200_000_000, "sent_bytes": 26_600_000_000}}
    assert ddp["comm_s"] == pytest.approx(26.6 / 450)
    assert ddp["fits"] is False
    assert data["link"] == {"name": "nvlink4", "per_direction_gbps": 450.0, "bidirectional_gbps": 900.0,
                            "description": data["link"]["description"]}
    assert data["pipeline"] is None


def test_json_reproduces_the_zero_paper_with_optimizer_12():
    data = json.loads(plan("--params", "7.5e9", "--ranks", "64", "--optimizer-bytes", "12", "--json").stdout)
    totals = {r["strategy"]: r["memory"]["total_bytes"] / 1e9 for r in data["strategies"]}
    # ZeRO paper Fig. 1: 120 / 31.4 / 16.6 / 1.9 GB
    assert [round(totals[s], 1) for s in ("ddp", "zero1", "zero2", "zero3")] == [120.0, 31.4, 16.6, 1.9]


def test_pipeline_bubble():
    res = plan("--params", "7e9", "--ranks", "4", "--pp-stages", "4", "--micro-batches", "8", "--json")
    assert res.returncode == 0, res.stderr
    pipe = json.loads(res.stdout)["pipeline"]
    assert pipe["gpipe_bubble_fraction"] == pytest.approx(3 / 11)  # chapter: ~27 %
    assert pipe["one_f_one_b_bubble_fraction"] == pytest.approx(3 / 11)
    assert pipe["bubble_by_micro_batches"]["1"] == pytest.approx(3 / 4)  # 75 %
    assert pipe["bubble_by_micro_batches"]["32"] == pytest.approx(3 / 35)  # ~9 %
    table = plan("--params", "7e9", "--ranks", "4", "--pp-stages", "4", "--micro-batches", "8").stdout
    assert "27.3 % for GPipe" in table and "75.0" in table and "8.6" in table
    assert "pp " in table


def test_link_as_a_number_is_gb_per_s_per_direction():
    data = json.loads(plan("--params", "7e9", "--ranks", "8", "--link", "123", "--state-model", "chapter",
                           "--json").stdout)
    assert data["link"]["per_direction_gbps"] == 123.0
    ddp = next(r for r in data["strategies"] if r["strategy"] == "ddp")
    assert ddp["comm_s"] == pytest.approx(24.5 / 123)
    assert "123 GB/s per direction" in plan("--params", "7e9", "--ranks", "8", "--link", "123").stdout


def test_gloo_backend_doubles_reduce_scatter():
    data = json.loads(plan("--params", "7e9", "--ranks", "8", "--backend", "gloo", "--json").stdout)
    zero2 = next(r for r in data["strategies"] if r["strategy"] == "zero2")
    assert zero2["comm"]["by_kind"]["reduce_scatter"]["sent_bytes"] == 24_500_000_000  # 2 x 7/8 x 14 GB


@pytest.mark.parametrize("args, message", [
    (["--params", "-7e9", "--ranks", "8"], "--params must be a positive"),
    (["--params", "lots", "--ranks", "8"], "--params must be a positive"),
    (["--params", "7e9", "--ranks", "0"], "--ranks must be >= 1"),
    (["--params", "7e9", "--ranks", "8", "--link", "carrier-pigeon"], "unknown link 'carrier-pigeon'"),
    (["--params", "7e9", "--ranks", "8", "--link", "0"], "positive"),
    (["--params", "7e9", "--ranks", "8", "--micro-batches", "8"], "--micro-batches needs --pp-stages"),
    (["--params", "7e9", "--ranks", "8", "--pp-stages", "3"], "multiple of --pp-stages"),
    (["--params", "7e9", "--ranks", "8", "--pp-stages", "4", "--micro-batches", "0"], "--micro-batches must be >= 1"),
    (["--params", "7e9", "--ranks", "8", "--step-s", "0"], "--step-s"),
    (["--params", "7e9", "--ranks", "8", "--mem-gb", "-1"], "--mem-gb"),
    (["--params", "7e9", "--ranks", "8", "--dtype", "int4"], "invalid choice"),
    (["--ranks", "8"], "required"),
    (["--params", "7e9", "--ranks", "8", "--activation-checkpointing"], "--activation-checkpointing needs --model"),
    (["--params", "7e9", "--ranks", "8", "--state-model", "folklore"], "invalid choice"),
])
def test_bad_inputs_exit_2_with_a_message(args, message):
    res = plan(*args)
    assert res.returncode == 2
    assert message in res.stderr
    assert "Traceback" not in res.stderr


def test_plan_runs_without_torch():
    code = ("import sys; sys.modules['torch'] = None; "
            "from ringtop.cli.main import main; "
            "rc = main(['plan', '--params', '7e9', '--ranks', '8', '--pp-stages', '2']); "
            "import ringtop.cli.plan; "
            "assert rc == 0, rc")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "zero3" in out.stdout

"""The one definition of each number (metrics/timing.py, metrics/costs/memory_model.py,
metrics/strategy_names.py), against hand arithmetic, with the cases that tell a wrong rule apart."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from ringtop.metrics import fmt
from ringtop.metrics.costs.memory_model import (
    DEEPSPEED_ADAM,
    TORCH_ADAM,
    chapter_optimizer_state,
    optimizer_state_of,
    predicted_state,
    sharding_of,
)
from ringtop.metrics.strategy_names import DATA_PARALLEL_STRATEGIES, SHARDED_STATE, sharded_label, sharded_words
from ringtop.metrics.timing import idle_ms, step_idle_ms


def test_idle_is_what_the_agent_sent_else_input_plus_exposed_comm():
    assert idle_ms(2.0, 5.0, 30.0) == 30.0  # a pipeline stage's bubble, as sent
    assert idle_ms(2.0, 5.0, 0.0) == 7.0  # not sent (an older agent): input + exposed
    assert idle_ms(2.0, 5.0, math.inf) == 7.0 and idle_ms(2.0, 5.0, math.nan) == 7.0
    assert idle_ms(math.nan, 5.0) == 5.0  # a time that is not finite counts as none
    # what the agent sends: the bubble replaces exposed comm in a pipeline, input is always in
    assert step_idle_ms(2.0, 5.0) == 7.0 and step_idle_ms(2.0, 5.0, 30.0) == 32.0


P = 1_000_000


@pytest.mark.parametrize("strategy, params, grads, optimizer", [
    # torch strategies: fp32 params and grads (4 B), torch Adam's two fp32 moments (8 B)
    ("ddp", 4 * P, 4 * P, 8 * P),
    ("fsdp-full", 4 * P // 4, 4 * P // 4, 8 * P // 4),
    # SHARD_GRAD_OP reshards its parameters after backward: between steps it holds a quarter
    ("fsdp-grad-op", 4 * P // 4, 4 * P // 4, 8 * P // 4),
    ("fsdp-no-shard", 4 * P, 4 * P, 8 * P),
    # DeepSpeed in bf16: 2 B params and grads, fp32 master + moments 12 B, optimizer / N from stage 1;
    # stage 1 keeps only its partition of the reduced gradients after backward, as stage 2
    ("zero1", 2 * P, 2 * P // 4, 12 * P // 4),
    ("zero2", 2 * P, 2 * P // 4, 12 * P // 4),
    ("zero3", 2 * P // 4, 2 * P // 4, 12 * P // 4),
])
def test_predicted_state_is_each_implementations_between_steps(strategy, params, grads, optimizer):
    got = predicted_state(strategy, 4, P, "bf16").memory
    assert (got.params_bytes, got.grads_bytes, got.optimizer_bytes) == (params, grads, optimizer)


def test_step_counters_are_one_per_tensor_for_torch_and_one_for_deepspeed():
    assert predicted_state("ddp", 2, P, "fp32", param_tensors=10).memory.optimizer_bytes == 8 * P + 10 * 4
    assert predicted_state("zero3", 2, P, "fp32", param_tensors=10).memory.optimizer_bytes == 12 * P // 2 + 4


def test_optimizer_state_models_say_which_they_are():
    assert [optimizer_state_of(s) for s in ("ddp", "fsdp", "pp", "zero1", "zero3")] == \
        [TORCH_ADAM, TORCH_ADAM, TORCH_ADAM, DEEPSPEED_ADAM, DEEPSPEED_ADAM]
    assert (TORCH_ADAM.bytes_per_param, DEEPSPEED_ADAM.bytes_per_param) == (8, 12)
    chapter = chapter_optimizer_state(2)  # bf16 params: the chapter's 4 x 2 B
    assert chapter.bytes_per_param == 8 and "chapter" in chapter.words
    for m in (TORCH_ADAM, DEEPSPEED_ADAM, chapter):
        assert "B/param" in m.words and "B/param" in m.short and "-adam" not in m.words + m.short
    assert "distributed-training-basics" in chapter.words  # never "the chapter" without saying which


def test_sharding_words_are_the_strategies_own_and_match_what_the_cost_model_shards():
    assert [SHARDED_STATE[s] for s in ("ddp", "zero1", "zero2", "zero3", "fsdp-full", "fsdp-grad-op")] == \
        ["", "optim", "grads+optim", "params+grads+optim", "params+grads+optim", "grads+optim"]
    for s in DATA_PARALLEL_STRATEGIES:
        assert sharded_words(s, "") == sharded_label(sharding_of(s), ""), s
    assert sharded_words("fsdp(grad-op)") == "grads+optim" and sharded_words("ddp") == "-"


DECIMAL_SIZE = re.compile(r"(?<![A-Za-z])[kKMGT]B(?![A-Za-z/])")
"""A decimal size unit (`13.2 MB`, an axis titled `GB`); rates (`GB/s`, `MB/s`) are decimal by design."""

NUMBERS_RUN = Path(__file__).resolve().parents[1] / "data" / "numbers_run"


def decimal_sizes(text: str) -> list[str]:
    return DECIMAL_SIZE.findall(text)


def shown_strings(node) -> list[str]:
    """Every string of a plotly figure's JSON a reader sees (titles, names, hover text), not its
    base64-packed arrays."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [t for x in node for t in shown_strings(x)]
    if isinstance(node, dict):
        return [t for k, v in node.items() if k not in ("bdata", "dtype") for t in shown_strings(v)]
    return []


def test_sizes_are_binary_everywhere():
    """One formatter: 8e6 bytes is 7.63 MiB, never "8.0 MB"; a checkpoint of 13.2e6 B reads 12.6MiB."""
    assert fmt.nbytes(13_200_000) == "12.6MiB" and fmt.mib(8_000_000) == "7.63"
    assert fmt.nbytes(14e9) == "13.0GiB"
    # the check below catches what `report` and `bundle` printed before: "13.2 MB", an axis in "GB"
    assert decimal_sizes("wrote r.html (13.2 MB)") and decimal_sizes("params + grads + optimizer (GB)")
    assert decimal_sizes("2 files, 0.0 MB -> b.tar.gz") and not decimal_sizes("12.6MiB 1.0GiB 3.2 GB/s 40 MB/s")


def test_report_and_bundle_show_sizes_in_binary_units(tmp_path, capsys):
    """`ringtop report`'s page (its memory chart's axis and hover text, the table) and what `report`
    and `bundle` print, of a recorded run: no decimal size anywhere a reader sees."""
    pytest.importorskip("plotly", reason="ringtop report needs plotly")
    from ringtop.cli.main import main
    from ringtop.cli.report import memory_section, read_run, size_unit
    from ringtop.metrics.units import GIB, MIB

    run = NUMBERS_RUN / "zero1"
    assert main(["report", str(run), "-o", str(tmp_path / "r.html")]) == 0
    assert main(["bundle", str(run), "--no-live", "-o", str(tmp_path / "b.tar.gz")]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"\(\d[\d.]*[KMG]iB\)", printed) and re.search(r"files, \d[\d.]*[KMG]iB ->", printed), printed
    assert decimal_sizes(printed) == [], printed
    page = (tmp_path / "r.html").read_text()
    figures = [json.loads(f) for f in re.findall(r"<script type='application/json' class='figure'[^>]*>(.*?)</script>",
                                                 page, flags=re.S)]
    assert len(figures) > 3
    outside_scripts = re.sub(r"<script\b.*?</script>", "", page, flags=re.S)
    assert decimal_sizes(outside_scripts) == []
    assert [s for f in figures for s in shown_strings(f) if decimal_sizes(s)] == []
    logs = read_run(run)
    fig = json.loads(memory_section(logs).figure.to_json())
    assert fig["layout"]["yaxis"]["title"]["text"] == "MiB"  # a small model's state: MiB, in MiB
    params = next(t for t in fig["data"] if t["name"] == "params")
    measured = logs.steps[0][-1].mem.params_bytes
    assert params["y"][0] == measured / MIB and params["hovertext"][0] == fmt.nbytes(measured)
    assert size_unit(GIB) == (GIB, "GiB") and size_unit(GIB - 1) == (MIB, "MiB")

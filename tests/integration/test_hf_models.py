"""The Hugging Face architectures in one process: the wrapper computes what transformers computes,
whole and split into pipeline stages; the catalogue's shapes have their published parameter counts
(on the meta device); FLOPs by 6N + 12LHS within 10 % of torch's flop counter; a user's config.json
is validated like any hostile input; `ringtop models` and `ringtop plan --model` count from the
definition without allocating the weights. The 2-rank training runs are in test_hf_strategies.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

pytest.importorskip("transformers", reason="the hf models need transformers (pip install 'ringtop[hf]')")

from ringtop.agent.config import ConfigError, config_from_options  # noqa: E402
from ringtop.agent.models.hf_catalogue import MAX_CONFIG_BYTES, ModelConfigError, resolve  # noqa: E402
from ringtop.agent.models.hf_models import _transformers, build_hf_model, build_meta_model, hf_config  # noqa: E402
from ringtop.metrics.costs.flops import within  # noqa: E402

TINY_MISTRAL = {"model_type": "mistral", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 300, "max_position_embeddings": 128,
                "sliding_window": 64}
TINY_QWEN2 = {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 1, "intermediate_size": 96, "vocab_size": 300, "max_position_embeddings": 128,
              "tie_word_embeddings": True, "torch_dtype": "bfloat16", "auto_map": {"AutoModel": "evil.Model"}}


def config_file(tmp_path, content) -> str:
    path = tmp_path / "config.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return f"hf-config:{path}"


def transformers_model(spec, model):
    """transformers' own *ForCausalLM of the same config, holding the wrapper's weights."""
    lm = _transformers().AutoModelForCausalLM.from_config(hf_config(spec))
    lm.load_state_dict(model.state_dict(), strict=True)
    return lm.eval()


@pytest.mark.parametrize("which", ["hf:llama-tiny", "hf:gpt2-tiny", "mistral", "qwen2"])
def test_the_wrapper_computes_what_transformers_computes_whole_and_split_into_stages(tmp_path, which):
    spec_text = {"mistral": lambda: config_file(tmp_path, TINY_MISTRAL),
                 "qwen2": lambda: config_file(tmp_path, TINY_QWEN2)}.get(which, lambda: which)()
    spec = resolve(spec_text)
    model = build_hf_model(spec, seed=0)
    x = torch.randint(0, spec.dims.vocab, (2, 24), generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, spec.dims.vocab, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = transformers_model(spec, model)(input_ids=x).logits
        ours = model.logits(x)
        # the same modules and kernels in the same order: equal to fp32's rounding of one op at most
        torch.testing.assert_close(ours, theirs)
        assert model(x, y).item() == pytest.approx(F.cross_entropy(theirs.reshape(-1, theirs.size(-1)),
                                                                   y.reshape(-1)).item(), rel=1e-6)
        split = model.pipeline_split()
        first = split.build_stage(range(0, 1), True, False)
        last = split.build_stage(range(1, split.n_layers), False, True)
        assert torch.equal(last(first(x)), ours), "two stages compute the whole model"
    names = set(first.state_dict()) | set(last.state_dict())
    assert names == set(model.state_dict()), "the stages keep the whole model's names"
    if split.tied is not None:  # the last stage's head is a copy of the embedding, not the same tensor
        embedding, head = first.get_parameter(split.tied[0]), last.get_parameter(split.tied[1])
        assert head is not embedding and torch.equal(head, embedding)
    assert "auto_map" not in spec.config and "torch_dtype" not in spec.config


@pytest.mark.parametrize("name,published", [
    ("gpt2-125m", 124_439_808),       # GPT-2 small
    ("gpt2-1b", 1_557_611_200),       # GPT-2 XL
    ("llama-1b", 1_100_048_384),      # TinyLlama-1.1B
    ("llama-7b", 6_738_415_616),      # Llama-2-7B
])
def test_published_shapes_have_their_published_parameter_counts_on_the_meta_device(name, published):
    model = build_meta_model(f"hf:{name}")
    params = {id(p): p for p in model.parameters()}.values()
    assert all(p.is_meta for p in params)
    assert sum(p.numel() for p in params) == published


def counted_flops_per_token(spec: str, seq_len: int) -> float:
    model = build_meta_model(spec)
    x = torch.randint(0, model.spec.dims.vocab, (2, seq_len), device="meta")
    with FlopCounterMode(display=False) as counter:
        model(x, x).backward()
    return counter.get_total_flops() / (2 * seq_len)


@pytest.mark.parametrize("spec,seq_len", [("hf:llama-tiny", 64), ("hf:llama-tiny", 256), ("hf:gpt2-tiny", 256),
                                          ("hf:llama-125m", 64), ("hf:llama-125m", 1024), ("hf:gpt2-125m", 1024)])
def test_the_flops_formula_is_within_10_percent_of_torchs_flop_counter(spec, seq_len):
    assert within(build_meta_model(spec).flops_per_token(seq_len), counted_flops_per_token(spec, seq_len), 0.10)


def test_the_flops_check_fails_a_formula_with_2n_or_without_the_head():
    from ringtop.agent.models.hf_models import non_embedding_params

    model = build_meta_model("hf:llama-125m")
    n, d = non_embedding_params(model), model.spec.dims
    counted = counted_flops_per_token("hf:llama-125m", 512)
    assert not within(2 * n + 12 * d.layers * d.hidden * 512, counted, 0.10)
    head = model.get_parameter("lm_head.weight").numel()
    assert not within(6 * (n - head) + 12 * d.layers * d.hidden * 512, counted, 0.10)


@pytest.mark.parametrize("content,message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"model_type": "llama", "hidden_size": NaN}', "not valid JSON"),
    ({"model_type": "bert", "hidden_size": 64}, "model_type 'bert' is not one ringtop trains"),
    ({**TINY_MISTRAL, "hidden_size": 10**9}, "hidden_size = 1000000000 is out of range"),
    ({**TINY_MISTRAL, "num_hidden_layers": True}, "num_hidden_layers must be an integer"),
    ({**TINY_MISTRAL, "num_hidden_layers": "2"}, "num_hidden_layers must be an integer"),
    ({**TINY_MISTRAL, "num_key_value_heads": 3}, "not a multiple of num_key_value_heads"),
    ({**TINY_MISTRAL, "hidden_size": 66}, "not a multiple of the 4 heads"),
    ({**TINY_MISTRAL, "hidden_act": "os.system"}, "hidden_act 'os.system' is not one of"),
    ({**TINY_MISTRAL, "rms_norm_eps": -1}, "rms_norm_eps must be a positive number"),
    ({**TINY_MISTRAL, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "transformers refuses the config"),
    ({**TINY_MISTRAL, "hidden_size": 65536, "intermediate_size": 1 << 20, "num_hidden_layers": 1024,
      "num_attention_heads": 1024, "num_key_value_heads": 1024}, "beyond what ringtop builds"),
])
def test_a_hostile_config_json_is_refused_in_one_line(tmp_path, content, message):
    spec = config_file(tmp_path, content)
    with pytest.raises(ModelConfigError, match=message) as caught:
        hf_config(resolve(spec))
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 400
    with pytest.raises(ConfigError, match=message):  # the agent's options say the same, before any rank starts
        config_from_options({"model": spec, "seq_len": 32})


def test_a_missing_huge_or_odd_config_file_is_refused(tmp_path):
    with pytest.raises(ModelConfigError, match="cannot read it"):
        resolve(f"hf-config:{tmp_path / 'absent.json'}")
    with pytest.raises(ModelConfigError, match="not a regular file"):
        resolve(f"hf-config:{tmp_path}")
    big = tmp_path / "big.json"
    big.write_text(" " * (MAX_CONFIG_BYTES + 1))
    with pytest.raises(ModelConfigError, match="too large"):
        resolve(f"hf-config:{big}")
    with pytest.raises(ModelConfigError, match="unknown architecture 'llama-70b'"):
        resolve("hf:llama-70b")
    with pytest.raises(ConfigError, match="exceeds hf:gpt2-tiny's 256 positions"):
        config_from_options({"model": "hf:gpt2-tiny", "seq_len": 257})
    with pytest.raises(ConfigError, match="sliding window 64"):
        config_from_options({"model": config_file(tmp_path, TINY_MISTRAL), "seq_len": 100})
    with pytest.raises(ConfigError, match="--model-size sizes the built-in"):
        config_from_options({"model": "hf:llama-tiny", "model_size": "10m"})


def test_pipeline_stages_hold_every_parameter_once_and_a_tied_heads_copy():
    from ringtop.strategies.pipeline import PipelineStrategy

    for name, copy in (("llama-tiny", 0), ("gpt2-tiny", 512 * 64)):  # gpt2-tiny: vocab 512 x hidden 64
        model = build_meta_model(f"hf:{name}")
        total = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
        counts = PipelineStrategy.stage_param_counts(model, 2)
        assert sum(c for c, _ in counts) == total + copy, name


def test_ringtop_models_lists_each_architecture_with_its_meta_count(capsys):
    from ringtop.agent.models.hf_catalogue import CATALOGUE
    from ringtop.cli.main import main

    assert main(["models", "--json"]) == 0
    listed = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(listed) == {f"hf:{n}" for n in CATALOGUE}
    assert listed["hf:llama-7b"]["params"] == 6_738_415_616 and listed["hf:gpt2-125m"]["params"] == 124_439_808
    assert (listed["hf:llama-7b"]["layers"], listed["hf:llama-7b"]["hidden"], listed["hf:llama-7b"]["heads"],
            listed["hf:llama-7b"]["vocab"]) == (32, 4096, 32, 32000)
    assert main(["models"]) == 0
    assert "hf:llama-1b    1,100,048,384" in capsys.readouterr().out


def test_plan_with_a_model_counts_from_its_definition(capsys):
    from ringtop.cli.plan import main

    spec = resolve("hf:gpt2-125m")
    with torch.device("meta"):  # the reference: transformers' own model, not ringtop's wrapper
        lm = _transformers().AutoModelForCausalLM.from_config(hf_config(spec))
    params = {id(p): p for p in lm.parameters()}.values()
    total = sum(p.numel() for p in params)
    lookups = lm.transformer.wpe.weight.numel()  # wte is also the head: its matmul counts
    seq, batch, ranks = 1024, 4, 8
    assert main(["--model", "hf:gpt2-125m", "--ranks", str(ranks), "--seq-len", str(seq), "--batch-size",
                 str(batch), "--accelerator", "H100 SXM", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    d = plan["model_definition"]
    assert plan["model"]["params"] == d["params"] == total
    assert (d["layers"], d["hidden"], d["vocab"]) == (12, 768, 50257)
    flops_per_token = 6 * (total - lookups) + 12 * 12 * 768 * seq
    assert d["flops_per_token"] == flops_per_token
    assert d["flops_per_step"] == flops_per_token * seq * batch * ranks
    assert d["compute_floor_s"] == pytest.approx(flops_per_token * seq * batch / 989e12)  # H100 SXM bf16 dense
    # Korthikanti's 34 s b h per layer in bf16, + fp32 logits and softmax
    assert d["activation_bytes_per_micro_batch"] == 12 * 34 * seq * batch * 768 + 8 * seq * batch * 50257
    ddp = next(r for r in plan["strategies"] if r["strategy"] == "ddp")
    assert ddp["step_floor_s"]["serial"] == pytest.approx(d["compute_floor_s"] + ddp["comm_s"])
    assert main(["--model", "hf:gpt2-125m", "--ranks", str(ranks), "--seq-len", str(seq), "--batch-size", str(batch),
                 "--accelerator", "H100 SXM", "--pp-stages", "2", "--micro-batches", "2", "--json"]) == 0
    pp_plan = json.loads(capsys.readouterr().out)
    pipe = pp_plan["model_definition"]["pipeline"]
    # a replica of 2 stages shares one rank's work; GPipe's bubble (S-1)/(S+M-1) = 1/3 stretches it
    assert pipe["compute_floor_s"] == pytest.approx(flops_per_token * seq * batch / 2 / (2 / 3) / 989e12)
    pp = next(r for r in pp_plan["strategies"] if r["strategy"] == "pp")
    assert pp["step_floor_s"]["compute"] == pipe["compute_floor_s"]
    assert main(["--model", "hf:gpt2-125m", "--ranks", "8"]) == 0
    assert "step-time floor: n/a (no --accelerator or --peak-tflops)" in capsys.readouterr().out


def test_plan_with_activation_checkpointing_keeps_one_input_per_layer_and_recomputes_forward(capsys):
    """Full recomputation (Korthikanti et al. 2022, section 5): each of gpt2's 12 layers keeps its
    input, s*b*h bf16 values, one layer's 34*s*b*h bytes are live while it is recomputed, plus the
    fp32 logits; the step does one more forward, 8N for 6N: the floor x 4/3."""
    from ringtop.cli.plan import main

    seq, batch = 1024, 4
    argv = ["--model", "hf:gpt2-125m", "--ranks", "8", "--seq-len", str(seq), "--batch-size", str(batch),
            "--accelerator", "H100 SXM", "--json"]
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)["model_definition"]
    assert main([*argv, "--activation-checkpointing"]) == 0
    ckpt = json.loads(capsys.readouterr().out)["model_definition"]
    sbh = seq * batch * 768
    assert ckpt["activation_checkpointing"] and not plain["activation_checkpointing"]
    assert ckpt["activation_bytes_per_micro_batch"] == 12 * sbh * 2 + 34 * sbh + 8 * seq * batch * 50257
    assert ckpt["activation_bytes_per_micro_batch"] < plain["activation_bytes_per_micro_batch"]
    assert ckpt["compute_floor_s"] == pytest.approx(plain["compute_floor_s"] * 4 / 3)
    assert ckpt["flops_per_step"] == plain["flops_per_step"]  # the model's FLOPs: MFU does not count recompute
    assert main([*argv[:-1], "--activation-checkpointing"]) == 0
    assert "activations per micro-batch (activation checkpointing): " in capsys.readouterr().out


def test_plan_refuses_bad_model_inputs_in_one_line(tmp_path, capsys):
    from ringtop.cli.plan import main

    for argv, message in ((["--model", "hf:nope", "--ranks", "2"], "unknown architecture 'nope'"),
                          (["--model", "hf:llama-7b", "--ranks", "2", "--accelerator", "TPU"], "not one device"),
                          (["--params", "7e9", "--ranks", "2", "--seq-len", "8"], "--seq-len needs --model"),
                          (["--model", config_file(tmp_path, "{"), "--ranks", "2"], "not valid JSON")):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        err = capsys.readouterr().err
        assert exited.value.code == 2 and message in err and err.count("\n") == 1, err


PLAN_7B = """
import json, resource, sys
import ringtop.agent.loop.runner, ringtop.agent.config
assert "transformers" not in sys.modules, "the agent imports transformers only when an hf model is asked for"
from ringtop.cli.plan import make_plan, build_parser
plan = make_plan(build_parser().parse_args(["--model", "hf:llama-7b", "--ranks", "8", "--accelerator", "H200"]))
print(json.dumps({"params": plan["model"]["params"], "rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


@pytest.mark.timeout(120)
def test_planning_a_7b_model_allocates_no_weights_and_the_agent_imports_no_transformers():
    out = subprocess.run([sys.executable, "-c", PLAN_7B], capture_output=True, text=True, timeout=110)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["params"] == 6_738_415_616
    # its fp32 weights would be 27 GB (bf16 13.5 GB); torch + transformers themselves take under 1 GB
    assert got["rss_kib"] * 1024 < 2e9, f"peak RSS {got['rss_kib'] / 1e6:.2f} GB"

"""Hugging Face architectures ringtop builds from a config, never from downloaded weights.

`--model hf:NAME` takes one of the configs written here (real published shapes where they exist),
`--model hf-config:PATH` a user's `config.json`. Either way the result is a plain dict of config
values that `agent.hf_models` hands to transformers' `AutoModelForCausalLM.from_config` (random
initial weights; no tokenizer, no hub access). A user's file is hostile input: its size, its JSON,
its `model_type` and every size in it are checked here, before transformers sees any of it.

Stdlib only: the CLI validates and lists without importing torch.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HF_PREFIX, HF_CONFIG_PREFIX = "hf:", "hf-config:"
MAX_CONFIG_BYTES = 1 << 20
"""A config.json is a few kB; a larger file is not one."""
LLAMA_LIKE = ("llama", "mistral", "qwen2")
"""Same module tree (embed_tokens, layers, norm, rotary_emb, lm_head): one adapter trains them all."""
MODEL_TYPES = (*LLAMA_LIKE, "gpt2")
MISTRAL_DEFAULT_WINDOW = 4096
"""transformers' MistralConfig default `sliding_window`, which applies when a config leaves it out."""
MAX_PARAMS = 1_000_000_000_000
"""A config whose parameter estimate exceeds this (1T) is a typo, not a model."""

_TRAINING_SETTINGS = {"use_cache": False}
_GPT2_NO_DROPOUT = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "summary_first_dropout": 0.0}
_LLAMA_NO_DROPOUT = {"attention_dropout": 0.0}


class ModelConfigError(ValueError):
    """A bad `--model hf:` / `hf-config:` spec or config file; one line, no traceback."""


def _llama(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int, vocab: int, positions: int,
           tie: bool = False, rope_theta: float = 10000.0) -> dict[str, Any]:
    return {"model_type": "llama", "hidden_size": hidden, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv_heads, "intermediate_size": intermediate,
            "vocab_size": vocab, "max_position_embeddings": positions, "rms_norm_eps": 1e-5,
            "rope_theta": rope_theta, "hidden_act": "silu", "tie_word_embeddings": tie,
            "attention_bias": False, "mlp_bias": False}


def _gpt2(hidden: int, layers: int, heads: int, vocab: int, positions: int) -> dict[str, Any]:
    return {"model_type": "gpt2", "n_embd": hidden, "n_layer": layers, "n_head": heads, "vocab_size": vocab,
            "n_positions": positions, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
            "tie_word_embeddings": True}


CATALOGUE: dict[str, tuple[str, dict[str, Any]]] = {
    # name: (what its shape is, config)
    "llama-tiny": ("for tests: 4 layers, GQA 4/2 heads", _llama(64, 4, 4, 2, 128, 512, 256)),
    "llama-125m": ("Llama-style at GPT-2 small's width and depth", _llama(768, 12, 12, 12, 2048, 32000, 2048)),
    "llama-1b": ("TinyLlama-1.1B's shape", _llama(2048, 22, 32, 4, 5632, 32000, 2048)),
    "llama-7b": ("Llama-2-7B's shape", _llama(4096, 32, 32, 32, 11008, 32000, 4096)),
    "gpt2-tiny": ("for tests: 2 layers, tied head", _gpt2(64, 2, 4, 512, 256)),
    "gpt2-125m": ("GPT-2 small (124M)", _gpt2(768, 12, 12, 50257, 1024)),
    "gpt2-1b": ("GPT-2 XL's shape (1.5B)", _gpt2(1600, 48, 25, 50257, 1024)),
    "gpt2-7b": ("GPT-2-style at Llama-2-7B's width and depth", _gpt2(4096, 32, 32, 50257, 2048)),
}


@dataclass(frozen=True)
class Dims:
    """What planning, FLOPs and the synthetic data need from a config, read the same way for each family."""

    model_type: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_positions: int
    tied: bool

    @property
    def attention_width(self) -> int:
        """Heads x head dim: the H of the 12 L H S attention term (equal to `hidden` but for odd configs)."""
        return self.heads * self.head_dim


@dataclass(frozen=True)
class HFModel:
    """A validated architecture: the name it goes by and the config to build it from."""

    name: str
    config: dict[str, Any]
    dims: Dims

    def training_config(self) -> dict[str, Any]:
        """The config as ringtop trains it: fp32, no dropout, no KV cache."""
        extra = _GPT2_NO_DROPOUT if self.dims.model_type == "gpt2" else _LLAMA_NO_DROPOUT
        return {**self.config, **_TRAINING_SETTINGS, **extra}


def is_hf_spec(spec: str) -> bool:
    return spec.startswith(HF_PREFIX) or spec.startswith(HF_CONFIG_PREFIX)


def resolve(spec: str) -> HFModel:
    """`hf:NAME` or `hf-config:PATH`, validated; raises ModelConfigError with a one-line reason."""
    if spec.startswith(HF_CONFIG_PREFIX):
        path = spec[len(HF_CONFIG_PREFIX):]
        if not path:
            raise ModelConfigError("--model hf-config:PATH needs the path of a config.json")
        return HFModel(spec, *_checked(read_config_file(Path(path)), f"--model {spec}"))
    if not spec.startswith(HF_PREFIX):
        raise ModelConfigError(f"--model {spec!r}: expected hf:NAME or hf-config:PATH")
    name = spec[len(HF_PREFIX):]
    if name not in CATALOGUE:
        raise ModelConfigError(f"--model {spec!r}: unknown architecture {name!r}; choose from "
                               f"{', '.join(CATALOGUE)} (`ringtop models` lists them)")
    return HFModel(spec, *_checked(dict(CATALOGUE[name][1]), f"--model {spec}"))


def read_config_file(path: Path) -> dict[str, Any]:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ModelConfigError(f"--model hf-config:{path}: cannot read it ({exc.strerror or exc})") from None
    if not path.is_file():
        raise ModelConfigError(f"--model hf-config:{path}: not a regular file")
    if size > MAX_CONFIG_BYTES:
        raise ModelConfigError(f"--model hf-config:{path}: {size} bytes is too large for a config.json "
                               f"(limit {MAX_CONFIG_BYTES})")
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except OSError as exc:
        raise ModelConfigError(f"--model hf-config:{path}: cannot read it ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ModelConfigError(f"--model hf-config:{path}: not valid JSON ({str(exc)[:120]})") from None
    if not isinstance(data, dict):
        raise ModelConfigError(f"--model hf-config:{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


_KEYS = {
    # dims field: (llama-like key, gpt2 key, lowest, highest)
    "layers": ("num_hidden_layers", "n_layer", 1, 1024),
    "hidden": ("hidden_size", "n_embd", 1, 65536),
    "heads": ("num_attention_heads", "n_head", 1, 1024),
    "vocab": ("vocab_size", "vocab_size", 2, 4_000_000),
    "max_positions": ("max_position_embeddings", "n_positions", 1, 1 << 20),
}


def _int(config: dict, key: str, lo: int, hi: int, where: str) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelConfigError(f"{where}: {key} must be an integer, got {value!r}"[:200])
    if not lo <= value <= hi:
        raise ModelConfigError(f"{where}: {key} = {value} is out of range [{lo}, {hi}]")
    return value


def _checked(config: dict[str, Any], where: str) -> tuple[dict[str, Any], Dims]:
    """Only the keys transformers reads for these families reach it, each of a sane type and size."""
    model_type = config.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ModelConfigError(f"{where}: model_type {model_type!r} is not one ringtop trains; use one of "
                               f"{', '.join(MODEL_TYPES)}"[:300])
    family = 1 if model_type == "gpt2" else 0
    got = {field: _int(config, keys[family], keys[2], keys[3], where) for field, keys in _KEYS.items()}
    explicit_head_dim = family == 0 and config.get("head_dim") is not None
    if got["hidden"] % got["heads"] and not explicit_head_dim:
        raise ModelConfigError(f"{where}: hidden size {got['hidden']} is not a multiple of the {got['heads']} heads")
    head_dim = got["hidden"] // got["heads"]
    kv_heads, intermediate = got["heads"], 4 * got["hidden"]
    if family == 0:
        if config.get("num_key_value_heads") is not None:
            kv_heads = _int(config, "num_key_value_heads", 1, got["heads"], where)
        if got["heads"] % kv_heads:
            raise ModelConfigError(f"{where}: num_attention_heads {got['heads']} is not a multiple of "
                                   f"num_key_value_heads {kv_heads}")
        if config.get("head_dim") is not None:
            head_dim = _int(config, "head_dim", 1, 4096, where)
        intermediate = _int(config, "intermediate_size", 1, 1 << 20, where)
    elif config.get("n_inner") is not None:
        intermediate = _int(config, "n_inner", 1, 1 << 20, where)
    if head_dim % 2 and family == 0:
        raise ModelConfigError(f"{where}: head dimension {head_dim} must be even (rotary embeddings)")
    tied = config.get("tie_word_embeddings", family == 1)
    if not isinstance(tied, bool):
        raise ModelConfigError(f"{where}: tie_word_embeddings must be true or false, got {tied!r}"[:200])
    for key in ("rms_norm_eps", "layer_norm_epsilon", "rope_theta", "initializer_range"):
        if key in config:
            value = config[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not 0 < value < 1e12:
                raise ModelConfigError(f"{where}: {key} must be a positive number, got {value!r}"[:200])
    for key in ("hidden_act", "activation_function"):
        if key in config and config[key] not in ("silu", "gelu", "gelu_new", "gelu_pytorch_tanh", "relu"):
            raise ModelConfigError(f"{where}: {key} {config[key]!r} is not one of silu, gelu, gelu_new, "
                                   "gelu_pytorch_tanh, relu"[:200])
    for key in ("attention_bias", "mlp_bias", "use_sliding_window"):
        if key in config and not isinstance(config[key], bool):
            raise ModelConfigError(f"{where}: {key} must be true or false, got {config[key]!r}"[:200])
    window = config.get("sliding_window")
    if window is not None and model_type in LLAMA_LIKE:
        _int(config, "sliding_window", 1, 1 << 20, where)
    if config.get("rope_scaling") is not None or config.get("rope_parameters") not in (None, {}):
        if not isinstance(config.get("rope_scaling") or config.get("rope_parameters"), dict):
            raise ModelConfigError(f"{where}: rope_scaling must be an object")
    dims = Dims(model_type=model_type, layers=got["layers"], hidden=got["hidden"], heads=got["heads"],
                kv_heads=kv_heads, head_dim=head_dim, intermediate=intermediate, vocab=got["vocab"],
                max_positions=got["max_positions"], tied=tied)
    estimate = estimated_params(dims)
    if estimate > MAX_PARAMS:
        raise ModelConfigError(f"{where}: about {estimate:.3g} parameters is beyond what ringtop builds "
                               f"({MAX_PARAMS:.0e})")
    allowed = _ALLOWED_KEYS[model_type if model_type == "gpt2" else "llama"]
    kept = {k: v for k, v in config.items() if k in allowed}
    kept["model_type"] = model_type
    if family == 0 and "num_key_value_heads" not in kept:
        kept["num_key_value_heads"] = kv_heads
    return kept, dims


_ALLOWED_KEYS = {
    "llama": {"model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings", "rms_norm_eps",
              "rope_theta", "rope_scaling", "rope_parameters", "hidden_act", "tie_word_embeddings",
              "attention_bias", "mlp_bias", "initializer_range", "sliding_window", "use_sliding_window"},
    "gpt2": {"model_type", "n_embd", "n_layer", "n_head", "n_inner", "vocab_size", "n_positions",
             "activation_function", "layer_norm_epsilon", "initializer_range", "tie_word_embeddings"},
}
"""Everything else in a user's file (token ids, generation settings, auto_map, quantization,
attention implementation...) is dropped: none of it shapes training here, and some of it
(`auto_map`, `trust_remote_code`-style keys) would make transformers run code."""


def estimated_params(d: Dims) -> int:
    """Parameters by the shapes (torch-free; for bounding hostile configs; the meta model counts exactly)."""
    attn = d.hidden * d.attention_width * 2 + d.hidden * d.kv_heads * d.head_dim * 2
    mlp = (3 if d.model_type in LLAMA_LIKE else 2) * d.hidden * d.intermediate
    embed = d.vocab * d.hidden * (1 if d.tied else 2)
    positions = d.max_positions * d.hidden if d.model_type == "gpt2" else 0
    return d.layers * (attn + mlp) + embed + positions


def tensor_parallel_refusal(model: HFModel, degree: int) -> str | None:
    """Why `model` cannot be split over `degree` tensor-parallel ranks (one line), or None: each
    rank must get whole query heads, whole key/value heads (in order: a rank's query heads then use
    its own key/value heads under GQA; GPT-2 has as many as query heads) and an equal slice of
    the MLP."""
    d = model.dims
    if d.model_type not in MODEL_TYPES:
        return f"tensor parallelism does not split {d.model_type} models"
    for count, what in ((d.heads, "attention heads"), (d.kv_heads, "key/value heads"),
                        (d.intermediate, "MLP width (intermediate_size)")):
        if count % degree:
            return (f"tensor parallelism over {degree} ranks: {degree} must divide {model.name}'s {count} {what} "
                    "(each rank computes whole heads and an equal slice of the MLP)")
    return None


def check_seq_len(model: HFModel, seq_len: int) -> None:
    """The sequence must fit the architecture's positions (and a sliding window, which the causal
    attention ringtop runs does not apply)."""
    if seq_len > model.dims.max_positions:
        raise ModelConfigError(f"--seq-len {seq_len} exceeds {model.name}'s {model.dims.max_positions} positions; "
                               f"use --seq-len <= {model.dims.max_positions}")
    window = model.config.get("sliding_window", MISTRAL_DEFAULT_WINDOW if model.dims.model_type == "mistral" else None)
    uses_window = model.config.get("use_sliding_window", model.dims.model_type == "mistral")
    if window is not None and uses_window and seq_len > window:
        raise ModelConfigError(f"--seq-len {seq_len} exceeds {model.name}'s sliding window {window}, which "
                               f"ringtop's causal attention does not apply; use --seq-len <= {window}")

"""Hugging Face causal LMs built from a config (agent.hf_catalogue), wrapped for ringtop's loop.

transformers is imported only here, and only when an hf model is asked for: the agent's start-up
and the core stay light. Nothing is downloaded (HF_HUB_OFFLINE is set before the import and
`from_pretrained` is never called): the weights are transformers' random initialisation, seeded
like the built-in model's.

The wrapper (`HFCausalLM`) keeps transformers' own modules under their own names
(`model.layers.3.self_attn.q_proj.weight`, `transformer.h.0.attn.c_attn.weight`, `lm_head.weight`),
so its full checkpoint's `model.safetensors` loads into the same transformers class. Its forward is
ringtop's: embeddings, the decoder layers one by one, final norm and head, then the mean token
cross-entropy, as the built-in model computes it — the same code runs whole or split into pipeline
stages (`pipeline_split`). Attention is transformers' SDPA with no mask (causal through
`is_causal`, deterministic on CPU), fp32, dropout 0, no KV cache.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ringtop.agent.models.hf_catalogue import LLAMA_LIKE, HFModel, ModelConfigError, resolve
from ringtop.agent.models.model import count_params
from ringtop.metrics.costs.flops import transformer_flops_per_token

META = torch.device("meta")


def _transformers():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        import transformers
    except ImportError:
        from ringtop.metrics.install_hint import install_command

        raise ImportError(f"--model hf:... needs transformers: {install_command('hf')}") from None
    return transformers


def hf_config(model: HFModel):
    """transformers' config object for `model` (SDPA attention, no token ids to check against the vocab).
    ModelConfigError, one line, when transformers refuses what passed ringtop's checks (a rope
    scaling without its keys, say)."""
    transformers = _transformers()
    values = dict(model.training_config())
    model_type = values.pop("model_type")
    try:
        config = transformers.AutoConfig.for_model(model_type, bos_token_id=None, eos_token_id=None,
                                                   pad_token_id=None, **values)
    except Exception as exc:
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise ModelConfigError(f"--model {model.name}: transformers refuses the config ({reason})"[:300]) from None
    config._attn_implementation = "sdpa"
    return config


@dataclass(frozen=True)
class _Family:
    """Where one family keeps its parts (dotted paths under the top-level model)."""

    body: str
    embed: str
    positions: str | None
    """A learned position table (GPT-2), added to the token embedding on the first stage."""
    rotary: str | None
    """Rotary embeddings (Llama): no parameters, recomputed on every stage."""
    layers: str
    norm: str


_LLAMA = _Family(body="model", embed="model.embed_tokens", positions=None, rotary="model.rotary_emb",
                 layers="model.layers", norm="model.norm")
_GPT2 = _Family(body="transformer", embed="transformer.wte", positions="transformer.wpe", rotary=None,
                layers="transformer.h", norm="transformer.ln_f")
HEAD = "lm_head"


def _set_path(root: nn.Module, path: str, module: nn.Module) -> None:
    *parents, leaf = path.split(".")
    owner = root
    for name in parents:
        if not hasattr(owner, name):
            owner.add_module(name, nn.Module())
        owner = getattr(owner, name)
    owner.add_module(leaf, module)


def _get_path(root: nn.Module, path: str) -> nn.Module:
    return root.get_submodule(path)


class HFCausalLM(nn.Module):
    """A transformers causal LM's modules, run by ringtop: forward(inputs, targets) -> mean token loss.

    Whole (`first` and `last`, every layer) or one pipeline stage of it (some layers; the
    embeddings only on the first, norm and head only on the last), always under the whole model's
    parameter names.
    """

    def __init__(self, spec: HFModel, family: _Family, parts: dict[str, nn.Module], layers: dict[int, nn.Module],
                 first: bool, last: bool, whole_layers: nn.ModuleList | None = None):
        super().__init__()
        self.spec, self.family, self.first, self.last = spec, family, first, last
        ahead = (family.embed, family.positions)  # registered before the layers, as transformers orders them
        for path in (p for p in ahead if p in parts):
            _set_path(self, path, parts[path])
        # the whole model keeps transformers' own ModuleList (FSDP wraps its items); a stage a ModuleDict
        # keyed by the layers' indices in the whole model, so the names stay the same
        _set_path(self, family.layers, whole_layers if whole_layers is not None
                  else nn.ModuleDict({str(i): m for i, m in layers.items()}))
        for path in (p for p in parts if p not in ahead):
            _set_path(self, path, parts[path])
        self.layer_ids = sorted(layers)

    # ------------------------------------------------------------------ forward

    def _layers(self) -> list[nn.Module]:
        container = _get_path(self, self.family.layers)
        if isinstance(container, nn.ModuleList):
            return list(container)
        return [container[str(i)] for i in self.layer_ids]

    def run_stage(self, x: torch.Tensor) -> torch.Tensor:
        """One stage: token ids (first stage) or hidden states in; hidden states or logits (last) out."""
        f = self.family
        t = x.shape[1]
        if t > self.spec.dims.max_positions:
            raise ValueError(f"sequence length {t} exceeds the model's maximum {self.spec.dims.max_positions}")
        position_ids = torch.arange(t, device=x.device).unsqueeze(0)
        if self.first:
            x = _get_path(self, f.embed)(x)
            if f.positions is not None:
                x = x + _get_path(self, f.positions)(position_ids)
        kwargs = {}
        if f.rotary is not None:
            kwargs = {"position_embeddings": _get_path(self, f.rotary)(x, position_ids), "position_ids": position_ids}
        for layer in self._layers():
            out = layer(x, attention_mask=None, use_cache=False, **kwargs)
            x = out[0] if isinstance(out, tuple) else out
        if self.last:
            x = _get_path(self, HEAD)(_get_path(self, f.norm)(x))
        return x

    def logits(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.run_stage(inputs)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        out = self.run_stage(inputs)
        if targets is None or not self.last:
            return out
        return F.cross_entropy(out.view(-1, out.size(-1)), targets.reshape(-1))

    # ------------------------------------------------------------------ facts

    def flops_per_token(self, seq_len: int) -> float:
        """6 N + 12 L H S, N all parameters but the embedding look-ups (a tied head counted once, as the head)."""
        d = self.spec.dims
        return transformer_flops_per_token(non_embedding_params(self), d.layers, d.attention_width, seq_len)

    def pipeline_split(self) -> HFPipelineSplit:
        return HFPipelineSplit(self)


def non_embedding_params(model: HFCausalLM) -> int:
    """Parameters that multiply activations: all but the token and position look-up tables, the
    token table counted once more when it is also the (tied) output head."""
    f = model.family
    lookups = _get_path(model, f.embed).weight.numel()
    if f.positions is not None:
        lookups += _get_path(model, f.positions).weight.numel()
    head_tied = _get_path(model, HEAD).weight is _get_path(model, f.embed).weight
    return count_params(model) - lookups + (_get_path(model, HEAD).weight.numel() if head_tied else 0)


class HFPipelineSplit:
    """How `strategies.pipeline` splits an HFCausalLM: its layers, the parts on the first and last
    stage, and the tied embedding/head pair (names), if any."""

    def __init__(self, model: HFCausalLM):
        self.model = model
        f = model.family
        self.n_layers = len(model._layers())
        self.max_seq_len = model.spec.dims.max_positions
        head, embed = _get_path(model, HEAD), _get_path(model, f.embed)
        self.tied = (f"{f.embed}.weight", f"{HEAD}.weight") if head.weight is embed.weight else None
        self.first_parts = [p for p in (f.embed, f.positions) if p is not None]
        self.every_parts = [f.rotary] if f.rotary is not None else []
        self.last_parts = [f.norm]

    def parts(self) -> list[nn.Module]:
        """Every piece a stage may hold, for freeing the ones it does not."""
        m = self.model
        return [_get_path(m, p) for p in (*self.first_parts, *self.last_parts, HEAD)] + m._layers()

    def stage_params(self, layers: range, first: bool, last: bool) -> list[nn.Parameter]:
        m, layer_list = self.model, self.model._layers()
        modules = [layer_list[i] for i in layers]
        if first:
            modules += [_get_path(m, p) for p in self.first_parts]
        if last:
            modules += [_get_path(m, p) for p in self.last_parts]
        params = list({id(p): p for mod in modules for p in mod.parameters()}.values())
        if last and (self.tied is None or not first):
            params.append(_get_path(m, HEAD).weight)  # its own copy when tied and split
        return params

    def build_stage(self, layers: range, first: bool, last: bool) -> HFCausalLM:
        m = self.model
        paths = [*self.every_parts, *(self.first_parts if first else ()), *(self.last_parts if last else ())]
        parts = {p: _get_path(m, p) for p in paths}
        layer_list = m._layers()
        stage = HFCausalLM(m.spec, m.family, parts, {i: layer_list[i] for i in layers}, first, last)
        if last:
            head = _get_path(m, HEAD)
            if self.tied is not None and not first:
                copy = nn.Linear(head.in_features, head.out_features, bias=False, device="meta")
                copy.weight = nn.Parameter(head.weight.detach().clone())
                head = copy
            _set_path(stage, HEAD, head)
        return stage


def _family(model_type: str) -> _Family:
    return _LLAMA if model_type in LLAMA_LIKE else _GPT2


def wrap(spec: HFModel, lm: nn.Module) -> HFCausalLM:
    """ringtop's wrapper around a transformers *ForCausalLM (its modules, not copies)."""
    family = _family(spec.dims.model_type)
    parts = {p: lm.get_submodule(p) for p in (family.embed, family.positions, family.rotary, family.norm, HEAD)
             if p is not None}
    layers = lm.get_submodule(family.layers)
    model = HFCausalLM(spec, family, parts, dict(enumerate(layers)), True, True, whole_layers=layers)
    return model


def build_hf_model(spec: HFModel | str, seed: int, device: torch.device | None = None) -> HFCausalLM:
    """Same seed, same weights, on every rank and in every reference run. Built on the current
    default device, or on `device` (a rank's GPU: a 7B model's 27 GB of fp32 weights are then never
    in host memory, and initialised there in seconds)."""
    if isinstance(spec, str):
        spec = resolve(spec)
    transformers = _transformers()
    config = hf_config(spec)
    cuda = device is not None and device.type == "cuda"
    with torch.random.fork_rng(devices=[device] if cuda else []):
        torch.manual_seed(seed)
        if device is None:
            lm = transformers.AutoModelForCausalLM.from_config(config)
        else:
            with torch.device(device):
                lm = transformers.AutoModelForCausalLM.from_config(config)
    lm.float()
    return wrap(spec, lm)


def build_meta_model(spec: HFModel | str) -> HFCausalLM:
    """The architecture on the meta device: shapes and counts, no memory, no initialisation cost."""
    with torch.device(META):
        return build_hf_model(spec, 0)


@dataclass(frozen=True)
class ModelFacts:
    """What `ringtop models` lists and `ringtop plan --model` plans with, counted on the meta device."""

    name: str
    model_type: str
    params: int
    """Unique parameters (a tied head once)."""
    non_embedding_params: int
    """The N of 6N: all but the look-up tables (a tied head counted, as the head)."""
    param_tensors: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    vocab: int
    max_positions: int
    tied: bool

    def flops_per_token(self, seq_len: int) -> float:
        return transformer_flops_per_token(self.non_embedding_params, self.layers, self.hidden, seq_len)


def model_facts(spec: HFModel | str) -> ModelFacts:
    """The architecture's counts from its definition on the meta device (no weights allocated)."""
    model = build_meta_model(spec)
    d = model.spec.dims
    return ModelFacts(name=model.spec.name, model_type=d.model_type, params=count_params(model),
                      non_embedding_params=non_embedding_params(model),
                      param_tensors=len({id(p) for p in model.parameters()}), layers=d.layers, hidden=d.hidden,
                      heads=d.heads, kv_heads=d.kv_heads, vocab=d.vocab, max_positions=d.max_positions, tied=d.tied)

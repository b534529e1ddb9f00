"""The pipeline strategy's timeline, full-state and gradient methods, as mixins of
`PipelineStrategy` (strategies/pipeline.py), which owns the attributes they read."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ringtop.metrics.costs import pipeline_schedule as ps
from ringtop.strategies.base import (
    StrategyError,
    unique_parameters,
)
from ringtop.strategies.pipeline_stages import (
    PipelineEvent,
    StageBubble,
    _full,
    _is_split,
)
from ringtop.strategies.tensor_parallel import _local, relayout_qkv
from ringtop.strategies.torch_native import _is_dtensor, _laid_out_like


class PipelineGradients:
    """A stage's gradients completed across the pipeline (the tied weight's two parts, the stage's
    replicas), the global norm over every stage, clipping and the optimizer step."""

    def _backward(self, loss: torch.Tensor) -> None:
        """The backward ran inside the schedule; here the gradients are completed: the tied weight's
        two parts summed, then each stage's gradients averaged over its replicas."""
        if self.tie_group is not None:
            tied = self.module.get_parameter(self.tied[0] if self.stage_index == 0 else self.tied[1])
            if tied.grad is None:
                tied.grad = torch.zeros_like(tied)
            dist.all_reduce(tied.grad, group=self.tie_group)
        if self.dp_group is not None:
            grads = [_local(p.grad) for p in unique_parameters(self.module) if p.grad is not None]
            if grads:
                flat = torch.cat([g.reshape(-1) for g in grads])
                dist.all_reduce(flat, group=self.dp_group)
                flat.div_(self.replicas)
                offset = 0
                for g in grads:
                    g.copy_(flat[offset:offset + g.numel()].view_as(g))
                    offset += g.numel()

    def _optimizer_step(self) -> None:
        params = [p for p in unique_parameters(self.module) if p.grad is not None]
        norm = self._global_grad_norm(params)
        self._grad_norm = norm
        if self._skip_if_not_finite(norm):  # the same norm on every stage and replica: all skip together
            return
        if self.settings.grad_clip > 0:
            if self.tp > 1:  # each rank scales its own part (torch's helper cannot mix DTensors and tensors)
                scale = torch.clamp(self.settings.grad_clip / (norm + 1e-6), max=1.0)
                for p in params:
                    _local(p.grad).mul_(scale)
            else:
                torch.nn.utils.clip_grads_with_norm_(params, self.settings.grad_clip, norm)
        self.optimizer.step()

    def _global_grad_norm(self, params: list[nn.Parameter]) -> torch.Tensor:
        """The norm over every stage's gradients, the tied weight once (the last stage leaves its
        copy out), as torch's clip_grad_norm_ would compute it over the whole model."""
        copy = (self.module.get_parameter(self.tied[1]) if self.tied is not None and self.num_stages > 1
                and self.stage_index == self.num_stages - 1 else None)
        counted = [p for p in params if p is not copy]
        if self.tp > 1:  # a split gradient's part on every tp rank, a replicated one once (tp rank 0's)
            counted = [p for p in counted if _is_split(p.grad) or self.tp_index == 0]
        sq = torch.zeros((), dtype=torch.float32, device=self.ctx.device)
        for p in counted:
            sq += _local(p.grad).detach().float().pow(2).sum()
        if self.tp > 1:
            dist.all_reduce(sq, group=self.tp_group)
        if self.num_stages > 1:
            dist.all_reduce(sq, group=self.pp_group)
        return sq.sqrt()


class PipelineTimeline:
    """What a stage did in its last step: its timeline, its window on the host clock, its bubble,
    and every stage's timeline gathered on rank 0."""

    def last_timeline(self) -> list[PipelineEvent]:
        """This stage's forward/backward events of the last step, in the order run."""
        return list(self._last_events)

    def last_window_ns(self) -> tuple[int, int]:
        """(start_ns, end_ns) of the last step's schedule on this rank."""
        return self._window_ns

    def last_bubble(self) -> StageBubble | None:
        """Busy, wait-to-receive and idle time and bubble of this stage's last step; None before one."""
        if not self._last_events:
            return None
        t0, t1 = self._window_ns
        events = [(e.stage, e.micro_batch, e.kind, e.start_ns / 1e6, e.end_ns / 1e6) for e in self._last_events]
        times = ps.stage_times(events, {self.stage_index: (t0 / 1e6, t1 / 1e6)}, self.num_stages)[self.stage_index]
        return StageBubble(
            stage=self.stage_index, stages=self.num_stages, replica=self.replica, schedule=self.schedule,
            micro_batches=self.micro_batches, window_ms=times.window_ms, busy_ms=times.busy_ms,
            forward_ms=times.forward_ms, backward_ms=times.backward_ms, wait_recv_ms=times.wait_recv_ms,
            idle_ms=times.idle_ms, bubble=times.bubble,
            theory=ps.theoretical_bubble(self.schedule, self.num_stages, self.micro_batches), warmup=self._warmup,
        )

    def gather_timeline(self) -> tuple[list[PipelineEvent], list[tuple[int, int]]]:
        """Collective over this rank's pipeline (every stage must call it): the last step's events
        of all its stages and each stage's (start_ns, end_ns) window. For benchmarks and tests; the
        agent publishes each rank's own `last_timeline()` instead."""
        if self.num_stages == 1:
            return self.last_timeline(), [self._window_ns]
        gathered: list[Any] = [None] * self.num_stages
        dist.all_gather_object(gathered, (self._last_events, self._window_ns), group=self.object_group)
        events = [PipelineEvent(*e) for evs, _ in gathered for e in evs]
        return events, [tuple(w) for _, w in gathered]


class PipelineStateDicts:
    """The full state of a model cut into stages: each stage's own tensors put back whole and
    gathered to rank 0, and loaded back into any stage split."""

    def _local_state(self) -> tuple[dict[str, torch.Tensor], dict[str, dict], list[dict]]:
        """This stage's state under the model's names; with tp, full tensors (collective over the
        stage's tp group) in the plain q|k|v layout."""
        model_state = {k: _full(v).detach().cpu().clone() for k, v in self.module.state_dict().items()}
        optim_state: dict[str, dict] = {}
        groups: list[dict] = []
        for group in self.optimizer.param_groups:
            fqns = []
            for p in group["params"]:
                fqn = self._fqn_of[id(p)]
                if self.tied is not None and fqn == self.tied[1] and self.num_stages > 1:
                    continue  # the copy of the embedding: stage 0 holds the same state
                fqns.append(fqn)
                if self.optimizer.state.get(p):
                    optim_state[fqn] = {k: (_full(v).detach().cpu().clone() if isinstance(v, torch.Tensor) else v)
                                        for k, v in self.optimizer.state[p].items()}
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": fqns})
        if self._rows is not None:
            inverse = torch.argsort(self._rows)
            model_state, optim_state = relayout_qkv(model_state, inverse), relayout_qkv(optim_state, inverse)
        return model_state, optim_state, groups

    def full_state_dict(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The model's full state under its original names (a tied head's weight included, equal to
        the embedding's) and the optimizer state in torch's full layout keyed by those names (the
        tied weight once, under the embedding's name). Collective over the ranks of replica 0 (every rank
        calls it; others return empty dicts); rank 0's result is complete."""
        local = self._local_state()
        if self.num_stages == 1:
            parts = [local]
        elif self.replica == 0 and self.tp_index == 0:
            parts = [None] * self.num_stages if self.ctx.rank == 0 else None
            dist.gather_object(local, parts, group=self.object_group, group_dst=0)
        else:
            parts = None
        if self.ctx.rank != 0:
            return {}, {}
        model_state: dict[str, Any] = {}
        optim_state: dict[str, Any] = {}
        groups: list[dict] = []
        for m, o, g in parts:
            model_state.update(m)
            optim_state.update(o)
            for i, group in enumerate(g):
                if i == len(groups):
                    groups.append({**group, "params": []})
                groups[i]["params"].extend(group["params"])
        order = {name: i for i, name in enumerate(self._param_fqns)}
        for group in groups:
            group["params"].sort(key=lambda n: order.get(n, len(order)))
        model_state = {k: model_state[k] for k in self._model_keys if k in model_state}
        optim_state = {k: optim_state[k] for k in self._param_fqns if k in optim_state}
        return model_state, {"state": optim_state, "param_groups": groups}

    def load_full_state_dict(self, model_state: dict[str, Any], optim_state: dict[str, Any], *,
                             weights_loaded: bool = False) -> None:
        """Inverse of `full_state_dict`; every rank passes the same full state. Each stage takes its
        own names; the last stage's copy of the tied weight takes the embedding's value and state."""
        own = self.module.state_dict()
        tied, tied_copy = self.tied or (None, None)
        model_state = relayout_qkv(model_state, self._rows)
        optim_state = {**optim_state, "state": relayout_qkv(optim_state.get("state", {}), self._rows)}

        def source(name: str, table: dict) -> str | None:
            if name in table:
                return name
            if tied is not None and name == tied_copy and tied in table:
                return tied
            return None

        missing = [k for k in own if source(k, model_state) is None]
        if missing:
            raise StrategyError(f"the checkpoint lacks {missing[:5]} (of {len(missing)}) needed by pipeline stage "
                                f"{self.stage_index}")
        state = optim_state.get("state", {})
        full_groups = optim_state.get("param_groups", [])
        group_of = {n: g for g in full_groups for n in g.get("params", [])}
        local: dict[str, Any] = {"state": {}, "param_groups": []}
        index = 0
        for group in self.optimizer.param_groups:
            ids = []
            hyper = {k: v for k, v in group.items() if k != "params"}
            for p in group["params"]:
                fqn = self._fqn_of[id(p)]
                src = source(fqn, state)
                if src is not None:
                    local["state"][index] = {k: (_laid_out_like(v, p) if _is_dtensor(p) and isinstance(v, torch.Tensor)
                                                 and v.shape == p.shape else v.clone() if isinstance(v, torch.Tensor)
                                                 else v) for k, v in state[src].items()}
                src_group = group_of.get(fqn) or group_of.get(tied if fqn == tied_copy else fqn)
                if src_group is not None:
                    hyper.update({k: v for k, v in src_group.items() if k != "params"})
                ids.append(index)
                index += 1
            local["param_groups"].append({**hyper, "params": ids})
        with torch.no_grad():
            for name, tensor in own.items():
                full = model_state[source(name, model_state)].to(device=tensor.device, dtype=tensor.dtype)
                _local(tensor).copy_(_local(_laid_out_like(full, tensor)))
        self.optimizer.load_state_dict(local)

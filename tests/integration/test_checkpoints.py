"""Checkpoints on real runs: full and sharded, foreground and background, atomic under a kill,
resumable into another strategy and world size, consolidated and inspected from the CLI."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import agent_env, further, poll_until
from numerics import LOSS_RTOL, assert_series_close
from reference import reference_run
from safetensors import safe_open

from ringtop.agent.checkpoints.format import load_full_files, read_meta, resolve
from ringtop.cli.launch import descendants, kill_all
from ringtop.protocol import Event

BATCH, SEQ, LR = 4, 32, 1e-3
COMMON = ("--batch-size", str(BATCH), "--seq-len", str(SEQ), "--lr", str(LR))


def command(run, cmd, **args):
    return list(run.send_command(cmd, args, timeout_s=120))


def mean_losses(run) -> dict[int, float]:
    a = {s.step: s.loss for s in run.steps(0)}
    b = {s.step: s.loss for s in run.steps(1)} if run.nproc > 1 else a
    return {step: (a[step] + b[step]) / 2 for step in sorted(a) if step in b}


@pytest.mark.timeout(240)
def test_full_and_sharded_saves_in_the_foreground_and_background(launch_agents, tmp_path):
    run = launch_agents(2, "--steps", "0", "--strategy", "fsdp", *COMMON, "--inject-save-delay", "1500")
    run.wait_for_step(2)
    full = command(run, "checkpoint", kind="full")
    sharded = command(run, "checkpoint", kind="sharded")
    assert [r.status for r in full] == ["ack", "done"] and [r.status for r in sharded] == ["ack", "done"]
    full_dir, sharded_dir = Path(full[-1].result["path"]), Path(sharded[-1].result["path"])
    with safe_open(str(full_dir / "model.safetensors"), framework="pt") as f:  # a plain tool reads the weights
        assert "blocks.0.qkv.weight" in f.keys()
    assert torch.load(full_dir / "state.pt")["step"] == full[-1].result["step"]
    assert (sharded_dir / ".metadata").exists() and len(list(sharded_dir.glob("*.distcp"))) == 2
    assert read_meta(sharded_dir)["strategy_options"] == {"sharding": "full"}

    background = run.send_command("checkpoint", {"kind": "sharded", "async": True}, timeout_s=120)
    ack = next(background)
    assert ack.status == "ack"
    time.sleep(0.3)
    refused = command(run, "checkpoint", kind="full")[-1]
    switch_refused = command(run, "switch", strategy="ddp")[-1]
    done = next(background)
    assert done.status == "done", done.error
    assert refused.status == "error" and "still being written" in refused.error
    assert switch_refused.status == "error" and "checkpoint is being written" in switch_refused.error
    assert resolve("latest", run.checkpoint_dir) == Path(done.result["path"])
    assert command(run, "stop")[-1].status == "done"
    assert run.wait(60) == 0, run.output()[-3000:]

    out = tmp_path / "consolidated"
    cli = subprocess.run([sys.executable, "-m", "ringtop.cli", "ckpt", "consolidate", str(sharded_dir), str(out)],
                         capture_output=True, text=True, env=agent_env(), timeout=60)
    assert cli.returncode == 0, cli.stderr
    model_state, _, payload = load_full_files(out)
    reference_model, _, _ = load_full_files(full_dir)
    assert payload["step"] == sharded[-1].result["step"]
    info = subprocess.run([sys.executable, "-m", "ringtop.cli", "ckpt", "info", str(sharded_dir)],
                          capture_output=True, text=True, env=agent_env(), timeout=60)
    assert info.returncode == 0 and "sharded checkpoint" in info.stdout and "fsdp" in info.stdout
    # its size on disk as the UI shows the reply's (Events, the header): binary units, one formatter
    on_disk = sharded[-1].result["bytes"]
    assert f"{on_disk / 2**20:.1f}MiB on disk" in info.stdout and " MB" not in info.stdout, info.stdout
    assert set(model_state) >= {"tok_emb.weight", "blocks.3.fc_out.bias"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind, source, target", [
    pytest.param("full", ("--strategy", "ddp"), ("--strategy", "fsdp"), id="full-ddp2-to-fsdp1",
                 marks=further),  # the sharded cases resume into another strategy and world too
    pytest.param("sharded", ("--strategy", "fsdp"), ("--strategy", "ddp"), id="sharded-fsdp2-to-ddp1"),
    pytest.param("sharded", ("--strategy", "tp", "--tp", "2"), ("--strategy", "fsdp"), id="sharded-tp2-to-fsdp1"),
])
def test_resume_into_another_strategy_and_world_size(launch_agents, kind, source, target):
    """A run on 2 ranks checkpoints at step 3 and 6; one process with the run's global batch goes on
    from step 6 as if it had been the one process all along. Tensor parallelism's 2 ranks read one
    batch (its group is one data shard), the others' two."""
    global_batch = BATCH if "tp" in source else 2 * BATCH
    first = launch_agents(2, "--steps", "6", *source, *COMMON, "--checkpoint-every", "3",
                          "--checkpoint-kind", kind, name="first")
    assert first.wait(120) == 0, first.output()[-3000:]
    second = launch_agents(0, "--steps", "9", *target, "--batch-size", str(global_batch), "--seq-len", str(SEQ),
                           "--lr", str(LR), "--resume", str(first.checkpoint_dir), name="second")
    assert second.wait(120) == 0, second.output()[-3000:]
    expected = reference_run(9, global_batch, SEQ, LR)
    continued = {s.step: s.loss for s in second.steps(0)}
    assert sorted(continued) == [7, 8, 9]
    assert_series_close([continued[s] for s in (7, 8, 9)], expected.losses[6:9], rtol=LOSS_RTOL, what="loss",
                        first_step=7)
    assert any(isinstance(m, Event) and m.kind == "resume" for m in second.messages(0))


@pytest.mark.timeout(300)
def test_a_rank_killed_during_a_save_leaves_the_previous_checkpoint_whole(launch_agents):
    run = launch_agents(2, "--steps", "0", *COMMON, "--checkpoint-every", "3", "--inject-save-delay", "2000")
    poll_until(lambda: (run.checkpoint_dir / "latest").exists(), 120, "the first checkpoint", interval_s=0.1)
    first = resolve("latest", run.checkpoint_dir)
    poll_until(lambda: list(run.checkpoint_dir.glob(".step-00000006-full.tmp")), 120, "the second save's start")
    kill_all([run.proc.pid, *descendants(run.proc.pid)])  # every rank, mid-save, no clean-up
    run.proc.wait(30)
    assert resolve("latest", run.checkpoint_dir) == first
    model_state, optim_state, payload = load_full_files(first)
    assert payload["step"] == 3 and optim_state["state"]

    resumed = launch_agents(2, "--steps", "6", *COMMON, "--resume", "latest", "--checkpoint-dir",
                            str(run.checkpoint_dir), name="resumed")
    assert resumed.wait(120) == 0, resumed.output()[-3000:]
    expected = reference_run(6, 2 * BATCH, SEQ, LR)
    losses = mean_losses(resumed)
    assert sorted(losses) == [4, 5, 6]
    assert_series_close([losses[s] for s in (4, 5, 6)], expected.losses[3:6], rtol=LOSS_RTOL, what="loss",
                        first_step=4)


@pytest.mark.timeout(300)
def test_a_background_sharded_save_of_replicated_state_resumes_exactly(launch_agents):
    """DDP holds the whole state on every rank; in a background save each rank stages and writes
    only its share of it (see the next test), and the checkpoint still resumes exactly."""
    run = launch_agents(2, "--steps", "0", "--strategy", "ddp", *COMMON)
    run.wait_for_step(2)
    done = list(run.send_command("checkpoint", {"kind": "sharded", "async": True}, timeout_s=120))[-1]
    assert done.status == "done", done.error
    assert command(run, "stop")[-1].status == "done"
    assert run.wait(60) == 0, run.output()[-3000:]
    path, step = Path(done.result["path"]), done.result["step"]
    parts = sorted(f.stat().st_size for f in path.glob("*.distcp"))
    assert len(parts) == 2 and parts[0] > 0.4 * sum(parts), parts

    resumed = launch_agents(0, "--steps", str(step + 3), "--strategy", "ddp", "--batch-size", str(2 * BATCH),
                            "--seq-len", str(SEQ), "--lr", str(LR), "--resume", str(path), name="resumed")
    assert resumed.wait(120) == 0, resumed.output()[-3000:]
    expected = reference_run(step + 3, 2 * BATCH, SEQ, LR)
    losses = {s.step: s.loss for s in resumed.steps(0)}
    assert sorted(losses) == [step + 1, step + 2, step + 3]
    assert_series_close([losses[s] for s in sorted(losses)], expected.losses[step:step + 3], rtol=LOSS_RTOL,
                        what="loss", first_step=step + 1)


def _share_worker(rank: int, port: int, out: str) -> None:
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from ringtop.agent.checkpoints.saver import this_ranks_share
    from ringtop.agent.distributed import exit_rank

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    state = {
        "model": {"big": torch.ones(100, 10), "small": torch.ones(3), "mid": torch.ones(40, 10),
                  "sharded": distribute_tensor(torch.ones(4, 4), mesh, [Shard(0)]),
                  f"only-on-rank-{rank}": torch.ones(50)},
        "optim": {"state": {"big": {"exp_avg": torch.zeros(100, 10), "step": torch.tensor(3.0)}},
                  "param_groups": [{"lr": 0.1, "params": ["big"]}]},
    }
    share = this_ranks_share(state, rank, dist.group.WORLD)
    kept = {f"{part}/{k}" for part in ("model",) for k in share["model"]}
    kept |= {f"optim/{k}" for k in share["optim"]["state"].get("big", {})}
    torch.save({"kept": sorted(kept), "param_groups": share["optim"]["param_groups"]}, f"{out}/rank-{rank}.pt")
    exit_rank(0)  # DTensor keeps the group alive past destroy_process_group: see exit_rank


@pytest.mark.timeout(120)
def test_each_rank_stages_only_its_share_of_the_replicated_state(tmp_path):
    from ringtop.protocol import free_tcp_port

    torch.multiprocessing.spawn(_share_worker, args=(free_tcp_port(), str(tmp_path)), nprocs=2)
    kept = [set(torch.load(tmp_path / f"rank-{r}.pt")["kept"]) for r in range(2)]
    replicated = {"model/big", "model/small", "model/mid", "optim/exp_avg", "optim/step"}
    assert kept[0] & kept[1] & replicated == set(), "a replicated tensor is staged twice"
    assert (kept[0] | kept[1]) & replicated == replicated, "a replicated tensor is staged by nobody"
    for r in range(2):  # what only this rank has, and its shards, it always keeps
        assert {"model/sharded", f"model/only-on-rank-{r}"} <= kept[r]
        assert torch.load(tmp_path / f"rank-{r}.pt")["param_groups"] == [{"lr": 0.1, "params": ["big"]}]
    sizes = {"model/big": 1000, "model/small": 3, "model/mid": 400, "optim/exp_avg": 1000, "optim/step": 1}
    loads = [sum(sizes[k] for k in kept[r] & replicated) for r in range(2)]
    assert min(loads) >= 0.4 * sum(loads), loads


def test_a_background_copy_does_not_share_memory_with_training():
    from ringtop.agent.checkpoints.saver import detached_copy

    weight = torch.ones(3)
    state = ({"w": weight}, {"state": {"w": {"exp_avg": weight * 2}}, "param_groups": [{"lr": 0.1}]})
    copy = detached_copy(state)
    weight.add_(1)
    state[1]["state"]["w"]["exp_avg"].add_(1)
    assert isinstance(copy, tuple)
    assert copy[0]["w"].tolist() == [1.0, 1.0, 1.0]
    assert copy[1]["state"]["w"]["exp_avg"].tolist() == [2.0, 2.0, 2.0]


def test_a_background_copy_keeps_a_tied_weight_one_tensor():
    from ringtop.agent.checkpoints.saver import detached_copy

    embedding = torch.ones(4, 2)
    state = {"tok_emb.weight": embedding, "head.weight": embedding.view(4, 2), "other": embedding[1:]}
    copy = detached_copy(state)
    assert copy["tok_emb.weight"] is copy["head.weight"]  # safetensors then writes it once
    assert copy["other"].data_ptr() != copy["tok_emb.weight"].data_ptr()
    embedding.add_(1)
    assert copy["tok_emb.weight"].tolist() == [[1.0, 1.0]] * 4 and copy["other"].tolist() == [[1.0, 1.0]] * 3

"""One 2-rank gloo run of many checkpoint saves, each with a fault on one rank (run by
`run_worker_script` from tests/integration/test_save_faults.py): `save_fault_worker.py CKDIR VICTIM CELLS OUT`.

CELLS is a JSON list of {kind, background, fault, rank}. Each process has a mount namespace of its
own (the suite runs as root), so a read-only folder or a full disk (a tiny tmpfs) is real on the
faulting rank alone: mounted over the temporary folder just before that rank opens it, unmounted
after the save. A "link" fault swaps a folder the rank is about to open for a symbolic link to
VICTIM; a "plant-*" fault plants links to VICTIM (or its file PRECIOUS) at a temporary, final or
file name, as a hostile user of a shared folder would. After every save the ranks all-reduce once
(training could go on). Each rank writes what every save ended with to OUT/rank-R.json."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from worker_results import finish, gloo_rank, run

from ringtop.agent.checkpoints import format as ckpt
from ringtop.agent.checkpoints.saver import CheckpointManager, SaveFailed
from ringtop.agent.loop import faults

SAVE_TIMEOUT_S = 60.0
PRECIOUS = "precious"
"""The file in VICTIM that planted links to a file point at: it must never change."""
PLANTED_NAMES = {"full": (ckpt.MODEL_FILE, ckpt.STATE_FILE, ckpt.META_FILE),
                 "sharded": ("__0_0.distcp", "__1_0.distcp", ".metadata", ".metadata.tmp", ckpt.META_FILE)}


class TinyState:
    """What CheckpointManager asks of a strategy: a real model's and Adam's state."""

    def __init__(self) -> None:
        self.model = torch.nn.Linear(64, 64)
        self.optimizer = torch.optim.Adam(self.model.parameters())
        self.model(torch.ones(2, 64)).sum().backward()
        self.optimizer.step()

    def full_state_dict(self):
        return self.model.state_dict(), self.optimizer.state_dict()

    def sharded_state_dict(self):
        return self.model.state_dict(), self.optimizer.state_dict()


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def fill(folder: Path) -> None:
    """The tmpfs mounted at `folder` left with no free byte."""
    with open(folder / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc


def own_mount_namespace() -> None:
    """unshare(CLONE_NEWNS) (os.unshare needs Python 3.12), mounts private from here on."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x00020000) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS) failed")
    sh("mount", "--make-rprivate", "/")


def main() -> int:
    ckdir, victim, cells, out = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3]), Path(sys.argv[4])
    rank, _ = gloo_rank()
    own_mount_namespace()
    control, io = dist.new_group(backend="gloo"), dist.new_group(backend="gloo")
    manager = CheckpointManager(str(ckdir), rank, control, io)
    state = TinyState()
    results = []
    for step, cell in enumerate(cells, start=1):
        tmp = ckdir / ckpt.temporary_name(step, cell["kind"])
        mounted: list[Path] = []
        swapped: list[tuple[Path, Path]] = []

        planted: list[Path] = []

        def hook(stage: str, kind: str, cell=cell, tmp=tmp, mounted=mounted, swapped=swapped, planted=planted,
                 step=step) -> None:
            if cell["rank"] != rank:
                return
            fault = cell["fault"]
            if fault == "exception" and stage == "write":
                raise RuntimeError("injected failure inside the writer")
            if fault == "swap-folder" and stage == "prepare":
                aside = ckdir.with_name(ckdir.name + ".aside")
                os.rename(ckdir, aside)
                os.symlink(victim, ckdir)
                swapped.append((aside, ckdir))
            if fault == "plant-tmp" and stage == "prepare":
                os.symlink(victim, tmp)  # left from a save that never ended, or planted
            if fault == "plant-latest" and stage == "prepare":
                (ckdir / "latest").unlink(missing_ok=True)
                os.symlink(victim / PRECIOUS, ckdir / "latest")
                os.symlink(victim / PRECIOUS, ckdir / f".latest.tmp-{os.getpid()}")  # the old temporary's name
                planted.append(ckdir / f".latest.tmp-{os.getpid()}")
            if fault == "plant-final" and stage == "prepare":
                os.symlink(victim, ckdir / ckpt.checkpoint_name(step, kind))
                planted.append(ckdir / ckpt.checkpoint_name(step, kind))
            if fault == "plant-files" and stage == "open":
                for name in PLANTED_NAMES[kind]:
                    os.symlink(victim / PRECIOUS, tmp / name)
            if stage != "open":
                return
            if fault == "readonly":
                sh("mount", "--bind", str(tmp), str(tmp))
                sh("mount", "-o", "remount,bind,ro", str(tmp))
                mounted.append(tmp)
            elif fault == "full":
                sh("mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(tmp))
                mounted.append(tmp)
                fill(tmp)
            elif fault == "link":
                aside = tmp.with_name(tmp.name + ".aside")
                os.rename(tmp, aside)
                os.symlink(victim, tmp)
                swapped.append((aside, tmp))

        faults.checkpoint_fault = hook
        error, started = None, time.monotonic()
        try:
            saved = manager.save(state, step, cell["kind"], {"cell": cell}, background=cell["background"])
            while manager.busy:
                assert time.monotonic() - started < SAVE_TIMEOUT_S, "a background save never ended"
                time.sleep(0.01)
                saved = manager.poll()
        except SaveFailed as exc:
            error, saved = str(exc), None
        finally:
            faults.checkpoint_fault = None
            for point in mounted:  # gone already if another rank's clean-up removed the folder under it
                subprocess.run(["umount", str(point)], capture_output=True)
            dist.barrier(group=control)
            if rank == cell["rank"]:
                for aside, link in swapped:  # the save may have removed the link already
                    if os.path.islink(link):
                        os.unlink(link)
                    os.rename(aside, link)
                for link in planted:
                    if os.path.islink(link):
                        os.unlink(link)
            dist.barrier(group=control)
        flag = torch.ones(1)
        dist.all_reduce(flag, group=control)  # the group still works: training goes on
        results.append({"step": step, "error": error, "seconds": time.monotonic() - started,
                        "saved": saved.path if saved is not None else None, "group_ok": flag.item() == 2})
    return finish(out, rank, {"results": results})


if __name__ == "__main__":
    run(main)

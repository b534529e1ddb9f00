"""A tiny GPT-2 (built from a config in code, no download) trained for a few steps by the real
Hugging Face Trainer or the real Lightning Trainer, watched through ringtop's callback.
Rank 0 checkpoints and stops each run through its control socket.
`trainer_worker.py hf,lightning OUT` (one after the other in the same processes, or either alone):
logs in OUT/logs-NAME, OUT/rank-R.json with each model's unique parameter bytes counted here."""

import json
import os
import sys
import threading
from pathlib import Path

import torch
import torch.distributed as dist
from conftest import poll_until

from ringtop.cli.ctl import send_command
from ringtop.protocol import connection_file, free_tcp_ports

STEPS, BATCH, SEQ_LEN, VOCAB = 500, 2, 16, 64
"""At most STEPS: rank 0's commander stops training once its checkpoint is done."""


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ_LEN, n_embd=32, n_layer=1, n_head=2))


class Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict:
        ids = torch.randint(0, VOCAB, (SEQ_LEN,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


def commander(run_id: str, seen: dict) -> threading.Thread:
    """On rank 0, as `ringtop ctl` would (its own socket, the run's keys): a checkpoint once a step
    is done, then a stop."""
    def command() -> None:
        path = connection_file.file_for(run_id)
        poll_until(path.exists, 60, "the run's connection file")
        info = connection_file.read(path)
        poll_until(lambda: list(send_command(info.control, "status", {}, 30, info.keys))[-1].result.get("step", 0) >= 2,
                   60, "step 2")
        for cmd, args in (("checkpoint", {"kind": "full"}), ("stop", {"reason": "commander"})):
            reply = list(send_command(info.control, cmd, args, 60, info.keys))[-1]
            seen[cmd] = {"status": reply.status, "result": reply.result, "error": reply.error}

    thread = threading.Thread(target=command, daemon=True)
    if os.environ["RANK"] == "0":
        thread.start()
    return thread


def options(out: Path, name: str) -> dict:
    publish, relay, control = (f"tcp://127.0.0.1:{p}" for p in free_tcp_ports(3))  # rank 0's count
    return {"run_id": f"{os.environ['RINGTOP_TEST_RUN_ID']}-{name}", "log_dir": str(out / f"logs-{name}"),
            "checkpoint_dir": str(out / f"checkpoints-{name}"), "publish": publish, "relay": relay,
            "control": control}


def hf(out: Path) -> tuple[torch.nn.Module, float]:
    from transformers import Trainer, TrainingArguments

    import ringtop.hf

    model = tiny_gpt2()
    args = TrainingArguments(output_dir=str(out / "hf"), per_device_train_batch_size=BATCH, max_steps=STEPS,
                             use_cpu=True, ddp_backend="gloo", report_to=[], save_strategy="no", logging_steps=100,
                             disable_tqdm=True, dataloader_num_workers=0, seed=0, include_num_input_tokens_seen=True)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens())
    ringtop.hf.watch(trainer, **options(out, "hf"))
    trainer.train()
    return model, 6.0 * BATCH * SEQ_LEN * model.num_parameters(exclude_embeddings=True)  # HF's own rule


def lightning(out: Path) -> tuple[torch.nn.Module, float]:
    import lightning.pytorch as pl
    from lightning.fabric.utilities.throughput import measure_flops
    from lightning.pytorch.strategies import DDPStrategy

    import ringtop.lightning

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.gpt = tiny_gpt2()
            with torch.device("meta"):  # as Lightning's ThroughputMonitor asks: FLOPs of one batch
                meta, ids = tiny_gpt2(), torch.zeros(BATCH, SEQ_LEN, dtype=torch.long)
                self.flops_per_batch = measure_flops(meta, lambda: meta(input_ids=ids, labels=ids).loss, lambda y: y)

        def training_step(self, batch, batch_idx):
            return self.gpt(input_ids=batch["input_ids"], labels=batch["labels"]).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    module = Module()
    callback = ringtop.lightning.RingtopCallback(tokens_per_step=BATCH * SEQ_LEN, **options(out, "lightning"))
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend="gloo"),
                         max_steps=STEPS, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[callback], default_root_dir=str(out))
    trainer.fit(module, torch.utils.data.DataLoader(Tokens(), batch_size=BATCH))
    return module, float(module.flops_per_batch)


def main() -> int:
    names, out = sys.argv[1].split(","), Path(sys.argv[2])
    result = {}
    for name in names:
        seen: dict = {}
        thread = commander(f"{os.environ['RINGTOP_TEST_RUN_ID']}-{name}", seen)
        model, flops = {"hf": hf, "lightning": lightning}[name](out)
        if thread.ident is not None:
            thread.join(60)
        unique = {id(p): p for p in model.parameters() if p.requires_grad}.values()
        result[name] = {"param_bytes": sum(p.numel() * p.element_size() for p in unique), "commands": seen,
                        "flops_per_step": flops}
    (out / f"rank-{os.environ['RANK']}.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    code = main()
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.exit(code)

"""`ringtop models`: the architectures `--model hf:NAME` builds, with their sizes.

Each is built on the meta device (shapes only, no memory) to count its parameters: torch and
transformers are imported here, lazily, never by the rest of the CLI.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from ringtop.agent.models.hf_catalogue import CATALOGUE, HF_PREFIX


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the list as JSON")


def rows() -> list[dict]:
    from ringtop.agent.models.hf_models import model_facts

    return [{**asdict(model_facts(f"{HF_PREFIX}{name}")), "shape": shape} for name, (shape, _) in CATALOGUE.items()]


def render(listed: list[dict]) -> str:
    header = ["model", "params", "layers", "hidden", "heads", "kv heads", "vocab", "positions", "head", "shape"]
    body = [[r["name"], f"{r['params']:,}", str(r["layers"]), str(r["hidden"]), str(r["heads"]), str(r["kv_heads"]),
             f"{r['vocab']:,}", f"{r['max_positions']:,}", "tied" if r["tied"] else "own", r["shape"]] for r in listed]
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i in (0, len(header) - 1) else c.rjust(w)
                       for i, (c, w) in enumerate(zip(row, widths))).rstrip() for row in [header, *body]]
    lines.insert(1, "-" * len(lines[0]))
    lines += ["", "Parameters counted on the meta device (no memory); weights are random, nothing is downloaded.",
              "Train one: ringtop run --nproc 2 -- --model hf:llama-tiny;  your own config: --model hf-config:PATH "
              "(llama, mistral, qwen2, gpt2);  plan one: ringtop plan --model hf:llama-7b --ranks 8"]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    try:
        listed = rows()
    except ImportError as exc:
        print(f"ringtop models: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(listed, indent=2) if args.json else render(listed))
    return 0

"""The agent's command line: its parser, made from AgentConfig's fields, and the config of what
was typed, checked once."""

from __future__ import annotations

import argparse
from typing import Any

from ringtop.agent.config.checks import adopt_ds_config, check_combinations
from ringtop.agent.config.fields import ENDPOINT_NAMES, AgentConfig, cli_fields
from ringtop.agent.config.options import RaisingParser, add_arguments


def add_agent_arguments(parser: argparse.ArgumentParser) -> None:
    """One argument per field with an Option, in groups as the fields come."""
    add_arguments(parser, cli_fields())


def config_from_options(given: dict[str, Any]) -> AgentConfig:
    """The config of the options given (field name -> value as argparse read it) over the fields'
    defaults, checked: each field's bounds, then the whole (checks.py)."""
    fields = {f.name: f for f in cli_fields()}
    values = {name: fields[name].option.parse(v) if fields[name].option.parse else v for name, v in given.items()}
    cfg = AgentConfig(**values, movable_endpoints=ENDPOINT_NAMES - given.keys())
    for field in cli_fields():
        field.check_bounds(getattr(cfg, field.name))
    check_combinations(cfg, given.keys())
    return adopt_ds_config(cfg, given.keys())


def agent_parser(prog: str = "python -m ringtop.agent") -> argparse.ArgumentParser:
    parser = RaisingParser(prog=prog, description="ringtop's per-rank training agent (run it under torchrun)")
    add_agent_arguments(parser)
    return parser


def parse_agent_args(argv: list[str]) -> AgentConfig:
    return config_from_options(vars(agent_parser().parse_args(argv)))

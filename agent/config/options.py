"""The flag framework: a config field whose annotation carries an `Option` is a command-line
flag. The parser, its help (with every default) and the bounds checks all come from the fields,
so an option is written once, where its field is."""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class Option:
    """How a config field is given on the command line (its place in `--help`, its flag,
    its check). A bool field is a flag that turns its default around."""

    group: str
    help: str
    flag: str = ""
    """Default: `--` and the field's name with dashes."""
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    default_text: str = ""
    """What the help says the default is, where the value says too little (None, 0.0)."""
    parse: Callable[[str], Any] | None = None
    """The typed text -> the field's value, raising ConfigError: for values that are not a number
    or a word."""
    ge: float | None = None
    gt: float | None = None
    bound_note: str = ""
    """Said after a value out of bounds, e.g. `0 = never`."""


@dataclass(frozen=True)
class CliField:
    """A config field that the command line sets, with its Option."""

    name: str
    option: Option
    value_type: type
    """int, float, str or bool (None taken off an optional field's type)."""
    default: Any

    @property
    def flag(self) -> str:
        return self.option.flag or "--" + self.name.replace("_", "-")

    @property
    def is_switch(self) -> bool:
        return self.value_type is bool

    def help_text(self) -> str:
        """The help, with the default for an option that takes a value (a switch's is: not given)."""
        text = self.option.help
        if not self.is_switch:
            default = self.option.default_text or self.default
            if default is None:
                raise TypeError(f"{self.name}: a default of None needs Option(default_text=...)")
            text += f" (default: {default})"
        return text.replace("%", "%%")  # argparse formats help with %

    def add_to(self, group: argparse._ArgumentGroup) -> None:
        """Left out of the namespace unless given (SUPPRESS), so what was typed can be told from a default."""
        if self.is_switch:
            kind: dict[str, Any] = {"action": "store_false" if self.default else "store_true"}
        else:
            kind = {"type": str if self.option.parse else self.value_type, "choices": self.option.choices,
                    "metavar": self.option.metavar}
        group.add_argument(self.flag, dest=self.name, default=argparse.SUPPRESS, help=self.help_text(), **kind)

    def check_bounds(self, value: Any) -> None:
        o = self.option
        if value is None:
            return
        if o.ge is not None and not value >= o.ge:
            bound = f">= {o.ge:g}"
        elif o.gt is not None and not value > o.gt:
            bound = f"> {o.gt:g}"
        else:
            return
        raise ConfigError(f"{self.flag} must be {bound}" + (f" ({o.bound_note})" if o.bound_note else ""))


def fields_of(struct: type[msgspec.Struct]) -> tuple[CliField, ...]:
    """The struct's fields that carry an Option, in the struct's order."""
    out = []
    for info in msgspec.structs.fields(struct):
        if typing.get_origin(info.type) is not Annotated:
            continue
        value_type, *extras = typing.get_args(info.type)
        option = next((x for x in extras if isinstance(x, Option)), None)
        if option is None:
            continue
        if typing.get_origin(value_type) in (typing.Union, types.UnionType):
            value_type = next(t for t in typing.get_args(value_type) if t is not type(None))
        out.append(CliField(info.name, option, typing.get_origin(value_type) or value_type, info.default))
    return tuple(out)


def add_arguments(parser: argparse.ArgumentParser, fields: tuple[CliField, ...]) -> None:
    """One argument per field, in groups as the fields come."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for field in fields:
        if field.option.group not in groups:
            groups[field.option.group] = parser.add_argument_group(field.option.group)
        field.add_to(groups[field.option.group])


class RaisingParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse calls this for unknown options and bad values
        raise ConfigError(f"{message} (see --help)")

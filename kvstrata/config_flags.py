"""Config dataclass fields as command-line flags, and their bounds checked.

`add_arguments(parser, Cls)` turns the fields of a config class (kvstrata/config.py) into `--flag-name`
options and `from_namespace(Cls, ns)` builds the frozen instance. Booleans become `--flag` / `--no-flag`
pairs unless a field names explicit spellings in `metadata["flags"]` (for example
`--enable-prefix-caching` / `--disable-prefix-caching`); a field's `min`/`max` metadata bounds its value
(`check_config`).
"""
from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _base_type(tp: Any) -> type:
    """int | None -> int; str -> str."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0]
    return tp


def add_arguments(parser: argparse.ArgumentParser, cls: type, exclude: tuple[str, ...] = ()) -> None:
    group = parser.add_argument_group(cls.__name__)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in exclude:
            continue
        meta = f.metadata
        tp = _base_type(hints[f.name])
        help_text = f"{meta.get('help', '')} (default: {f.default})"
        if meta.get("repeatable"):  # a tuple field: one value per use of the flag
            group.add_argument(_flag(f.name), dest=f.name, action="append", default=None, help=help_text)
            continue
        if tp is bool:
            on, off = meta.get("flags", (_flag(f.name), "--no-" + f.name.replace("_", "-")))
            group.add_argument(on, dest=f.name, action="store_true", default=f.default, help=help_text)
            group.add_argument(off, dest=f.name, action="store_false", help=f"turn off {on}")
            continue
        names = [_flag(f.name), *meta.get("aliases", [])]
        group.add_argument(
            *names, dest=f.name, type=tp, default=f.default, choices=meta.get("choices"), help=help_text
        )


class ConfigError(ValueError):
    """A configuration value outside what kvstrata accepts."""


def check_config(cfg: Any) -> None:
    """Raise ConfigError naming the flag when a field is outside its `min`/`max` metadata."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if value is None or isinstance(value, bool):
            continue
        lo, hi = f.metadata.get("min"), f.metadata.get("max")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            bounds = f">= {lo}" if hi is None else f"between {lo} and {hi}"
            raise ConfigError(f"{_flag(f.name)} must be {bounds}, got {value}")


def from_namespace(cls: type[T], ns: argparse.Namespace) -> T:
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values = {k: v for k, v in vars(ns).items() if k in names}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.metadata.get("repeatable") and f.name in values:
            values[f.name] = tuple(values[f.name] or f.default)
    cfg = cls(**values)
    check_config(cfg)
    return cfg

"""Frozen configuration dataclasses; the CLI is generated from their fields.

One place for every default and its help text: `add_arguments(parser, Cls)` turns the fields of a
config class into `--flag-name` options and `from_namespace(Cls, ns)` builds the frozen instance.
Booleans become `--flag` / `--no-flag` pairs unless a field names explicit spellings in
`metadata["flags"]` (for example `--enable-prefix-caching` / `--disable-prefix-caching`).
"""
from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


def opt(default: Any, help: str, **extra: Any) -> Any:  # noqa: A002 - mirrors argparse
    """A dataclass field with CLI help (and optional `choices`, `flags`, `aliases`)."""
    return field(default=default, metadata={"help": help, **extra})


@dataclass(frozen=True)
class ModelConfig:
    model: str = opt("smollm2", "model name (smollm2), a GGUF file or a Hugging Face folder")
    served_model_name: str | None = opt(None, "model id served over the API (default: --model's name)")
    dtype: str = opt(
        "auto",
        "weights/activations dtype; auto = bfloat16 (3x faster matmuls than float32 on this CPU)",
        choices=["auto", "float32", "bfloat16", "float16"],
    )
    device: str = opt("cpu", "torch device: cpu or cuda[:N]")
    max_model_len: int | None = opt(None, "context length limit (default: the model's own)")
    num_threads: int | None = opt(None, "torch intra-op threads on CPU (default: all cores)")
    attention_backend: str = opt("torch_sdpa", "attention implementation", choices=["torch_sdpa"])
    seed: int = opt(0, "global seed for requests that give none")

    def torch_dtype_name(self) -> str:
        if self.dtype != "auto":
            return self.dtype
        return "bfloat16"


@dataclass(frozen=True)
class CacheConfig:
    max_total_tokens: int | None = opt(
        None, "KV pool size in tokens (default: from --kv-cache-memory)"
    )
    kv_cache_memory: float = opt(1.0, "KV pool size in GB when --max-total-tokens is not given")
    page_size: int = opt(
        16,
        "tokens per KV page, the prefix-reuse boundary",
        aliases=["--prefix-granularity"],
    )
    enable_prefix_caching: bool = opt(
        True,
        "reuse KV of prompt prefixes seen before",
        flags=("--enable-prefix-caching", "--disable-prefix-caching"),
    )


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = opt(64, "most requests running at once")
    max_num_batched_tokens: int = opt(2048, "most tokens computed in one engine step")
    chunked_prefill_size: int = opt(512, "most prompt tokens one request prefills per step")
    max_n: int = opt(8, "largest `n` (choices per request) accepted")
    max_stop_strings: int = opt(16, "most stop strings per request")


@dataclass(frozen=True)
class ServerConfig:
    host: str = opt("127.0.0.1", "address to listen on")
    port: int = opt(8000, "port to listen on")
    enable_log_request_stats: bool = opt(False, "log one key=value line per finished request")
    log_level: str = opt("info", "log level", choices=["debug", "info", "warning", "error"])


CONFIG_CLASSES: tuple[type, ...] = (ModelConfig, CacheConfig, SchedulerConfig, ServerConfig)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _base_type(tp: Any) -> type:
    """int | None -> int; str -> str."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0]
    return tp


def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    group = parser.add_argument_group(cls.__name__)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        meta = f.metadata
        tp = _base_type(hints[f.name])
        help_text = f"{meta.get('help', '')} (default: {f.default})"
        if tp is bool:
            on, off = meta.get("flags", (_flag(f.name), "--no-" + f.name.replace("_", "-")))
            group.add_argument(on, dest=f.name, action="store_true", default=f.default, help=help_text)
            group.add_argument(off, dest=f.name, action="store_false", help=f"turn off {on}")
            continue
        names = [_flag(f.name), *meta.get("aliases", [])]
        group.add_argument(
            *names, dest=f.name, type=tp, default=f.default, choices=meta.get("choices"), help=help_text
        )


def from_namespace(cls: type[T], ns: argparse.Namespace) -> T:
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in vars(ns).items() if k in names})

"""Mooncake FAST'25 traces: parse, validate, slice, and the ideal prefix hit rate.

One JSON object a line (also what AIPerf / genai-perf replay as `mooncake_trace`):

    {"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [int, ...]}

A hash id stands for one block of `block_size` (512) prompt tokens; requests sharing a leading run
of ids share that prefix. The file may be gzipped (bench/traces/synthetic_trace.jsonl.gz is): `load_trace`
looks at its first two bytes, not its name. It rejects a bad line with a `TraceError` naming it: bad JSON,
a missing or mistyped field, more hash ids than ceil(input_length / block_size) allows, or a
timestamp earlier than the line before. A trace whose ids cover fewer blocks than the prompt has
gets fresh ids (never seen elsewhere) for the rest, so every block of every prompt has an id.

The ideal (the trace's own definition): sum over requests of min(m * block_size, input_length),
over the sum of input_length, where m is the number of leading ids some earlier request had.
"""
from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Sequence

TRACE_BLOCK_SIZE = 512
GZIP_MAGIC = b"\x1f\x8b"
FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


class TraceError(ValueError):
    """A trace line that cannot be replayed; the message names the file and line."""


@dataclass(frozen=True)
class TraceRequest:
    line: int  # 1-based line in the file
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]  # one per block, ceil(input_length / block_size) of them


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_line(text: str, line: int, block_size: int = TRACE_BLOCK_SIZE, where: str = "trace") -> TraceRequest:
    """One line -> TraceRequest (its hash ids as given); raises TraceError naming `where:line`."""

    def fail(msg: str) -> TraceError:
        return TraceError(f"{where}:{line}: {msg}")

    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise fail(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise fail(f"expected a JSON object, got {type(obj).__name__}")
    missing = [f for f in FIELDS if f not in obj]
    if missing:
        raise fail(f"missing field {', '.join(repr(f) for f in missing)} (each line needs {', '.join(FIELDS)})")
    ts, n_in, n_out, ids = (obj[f] for f in FIELDS)
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
        raise fail(f"'timestamp' must be a number of milliseconds >= 0, got {ts!r}")
    if not _is_int(n_in) or n_in < 1:
        raise fail(f"'input_length' must be an integer >= 1, got {n_in!r}")
    if not _is_int(n_out) or n_out < 0:
        raise fail(f"'output_length' must be an integer >= 0, got {n_out!r}")
    if not isinstance(ids, list) or not all(_is_int(h) and h >= 0 for h in ids):
        raise fail("'hash_ids' must be a list of integers >= 0")
    allowed = -(-n_in // block_size)
    if len(ids) > allowed:
        raise fail(
            f"{len(ids)} hash_ids but input_length {n_in} allows at most {allowed} "
            f"(ceil({n_in} / {block_size})-token blocks); is the block size {block_size}? (--trace-block-size)"
        )
    return TraceRequest(line, float(ts), n_in, n_out, tuple(ids))


def load_trace(path: str | Path, block_size: int = TRACE_BLOCK_SIZE) -> list[TraceRequest]:
    """Every request of the file, validated, with ids filled in for blocks the trace left without.
    Blank lines are skipped. Raises TraceError (bad line, backwards timestamp, empty file) or OSError."""
    if block_size < 1:
        raise TraceError(f"--trace-block-size must be >= 1, got {block_size}")
    path = Path(path)
    out: list[TraceRequest] = []
    with open_text(path) as fh:
        for i, text in enumerate(fh, 1):
            if not text.strip():
                continue
            req = parse_line(text, i, block_size, str(path))
            if out and req.timestamp_ms < out[-1].timestamp_ms:
                raise TraceError(
                    f"{path}:{i}: timestamp {req.timestamp_ms:g} ms goes backwards "
                    f"(line {out[-1].line} has {out[-1].timestamp_ms:g} ms); requests must be in arrival order"
                )
            out.append(req)
    if not out:
        raise TraceError(f"{path}: no requests")
    return fill_ids(out, block_size)


def open_text(path: Path) -> IO[str]:
    """The file as UTF-8 text, decompressed when it starts with gzip's magic bytes."""
    with path.open("rb") as raw:
        gzipped = raw.read(2) == GZIP_MAGIC
    return gzip.open(path, "rt", encoding="utf-8") if gzipped else path.open(encoding="utf-8")


def fill_ids(requests: list[TraceRequest], block_size: int = TRACE_BLOCK_SIZE) -> list[TraceRequest]:
    """Give every block without an id a fresh one (above every id in the trace): unshared blocks."""
    fresh = 1 + max((h for r in requests for h in r.hash_ids), default=-1)
    out = []
    for r in requests:
        need = -(-r.input_length // block_size) - len(r.hash_ids)
        if need > 0:
            r = TraceRequest(r.line, r.timestamp_ms, r.input_length, r.output_length,
                             r.hash_ids + tuple(range(fresh, fresh + need)))
            fresh += need
        out.append(r)
    return out


def select(requests: list[TraceRequest], start: int = 0, max_requests: int | None = None) -> list[TraceRequest]:
    """The slice [start, start + max_requests); raises TraceError when it is empty."""
    if start < 0 or (max_requests is not None and max_requests < 1):
        raise TraceError(f"--start must be >= 0 and --max-requests >= 1 (got {start}, {max_requests})")
    end = len(requests) if max_requests is None else start + max_requests
    picked = requests[start:end]
    if not picked:
        raise TraceError(f"--start {start} is past the trace's {len(requests)} requests")
    return picked


def leading_seen(requests: Sequence[TraceRequest]) -> list[int]:
    """m per request: how many of its leading ids some earlier request (of `requests`) had."""
    seen: set[int] = set()
    out = []
    for r in requests:
        m = 0
        for h in r.hash_ids:
            if h not in seen:
                break
            m += 1
        out.append(m)
        seen.update(r.hash_ids)
    return out


def ideal_hit_rate(requests: Sequence[TraceRequest], block_size: int = TRACE_BLOCK_SIZE) -> float:
    """The trace's ideal: sum(min(m * block_size, input_length)) / sum(input_length)."""
    hits = sum(min(m * block_size, r.input_length) for m, r in zip(leading_seen(requests), requests))
    return hits / sum(r.input_length for r in requests)


def unique_blocks(requests: Sequence[TraceRequest]) -> int:
    return len({h for r in requests for h in r.hash_ids})

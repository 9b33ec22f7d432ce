"""KV cache events on the wire: vLLM's format, so Dynamo, llm-d and SGLang's router can read ours.

One ZMQ PUB message per batch, three frames:

    topic (UTF-8, "" by default) | sequence (8 bytes, big-endian, from 0) | msgpack payload

    payload = [ts, [event, ...], data_parallel_rank]            # ts: float64 seconds since the epoch
    event   = ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]
            | ["BlockRemoved", block_hashes, medium]
            | ["AllBlocksCleared"]

Positional arrays with the tag first: the layout of msgspec's `array_like=True, tag=True` structs,
which vLLM (<= 0.11) and SGLang publish and most consumers decode. One block is one KV page
(`block_size` = page size); `token_ids` holds the pages' tokens back to back; hashes are the page
hash chain cut to signed int64 (`hashing.hash_to_int64`); `parent_block_hash` is None when the
pages hang from the root; `lora_id` is always None; `medium` names the tier ("GPU" = L1).

The replay socket (ZMQ ROUTER) answers a request [b"", start_seq (8 bytes, big-endian)] with one
message [b"", seq, payload] per buffered batch with seq >= start_seq, then [b"", -1 (8 bytes,
big-endian, signed), b""].
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any, NamedTuple, Union

MEDIUM_DEVICE = "GPU"  # L1, whatever the hardware; tiers publish "CPU" (L2) and "STORE" (L3)
END_SEQ = (-1).to_bytes(8, "big", signed=True)


@dataclass(frozen=True)
class KVEventsConfig:
    """vLLM's `--kv-events-config` JSON, field for field."""

    enable_kv_cache_events: bool = False
    publisher: str = "null"  # "zmq" or "null"
    endpoint: str = "tcp://*:5557"  # bound when it holds "*", "::", ipc:// or inproc://, else connected
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000  # batches kept for replay
    hwm: int = 100_000  # ZMQ send high-water mark
    max_queue_size: int = 100_000  # events waiting for the publisher thread; more are dropped
    topic: str = ""

    @property
    def enabled(self) -> bool:
        return self.enable_kv_cache_events and self.publisher != "null"

    @classmethod
    def from_json(cls, text: str | None) -> KVEventsConfig:
        """Parse `--kv-events-config`; a ValueError names the bad key or value."""
        if not text:
            return cls()
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--kv-events-config is not valid JSON ({exc}); pass a JSON object") from None
        if not isinstance(raw, dict):
            raise ValueError("--kv-events-config must be a JSON object")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise ValueError(f"--kv-events-config: unknown keys {unknown}; known keys are {sorted(known)}")
        cfg = cls(**raw)
        if cfg.publisher not in ("zmq", "null"):
            raise ValueError(f"--kv-events-config: publisher {cfg.publisher!r} is not one of 'zmq', 'null'")
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            value = getattr(cfg, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"--kv-events-config: {name} must be a non-negative integer, got {value!r}")
        return cfg


def offset_endpoint(endpoint: str | None, rank: int) -> str | None:
    """The endpoint rank `rank` uses: TCP port + rank, or an `_dp{rank}` suffix for ipc/inproc.

    A wildcard port ("tcp://127.0.0.1:*", bind to any free port) is left as it is.
    """
    if not endpoint or rank == 0:
        return endpoint
    if endpoint.startswith(("inproc://", "ipc://")):
        return f"{endpoint}_dp{rank}"
    base, sep, port = endpoint.rpartition(":")
    if endpoint.startswith("tcp://") and sep and port.isdigit():
        return f"{base}:{int(port) + rank}"
    if endpoint.startswith("tcp://") and port == "*":
        return endpoint
    raise ValueError(f"KV events endpoint {endpoint!r} must look like tcp://HOST:PORT, ipc://PATH or inproc://NAME")


def should_bind(endpoint: str) -> bool:
    """vLLM's rule: bind a wildcard or local-transport address, connect to anything else."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


# -- events, as the consumer sees them -----------------------------------------------------------


class BlockStored(NamedTuple):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(NamedTuple):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(NamedTuple):
    pass


Event = Union[BlockStored, BlockRemoved, AllBlocksCleared]
_EVENT_TYPES: dict[str, type] = {cls.__name__: cls for cls in (BlockStored, BlockRemoved, AllBlocksCleared)}


class EventBatch(NamedTuple):
    ts: float
    events: list[Event]
    data_parallel_rank: int | None


def encode_event(event: Event) -> list[Any]:
    """The positional array of one event: its type name, then its fields in order."""
    return [type(event).__name__, *event]


def encode_batch(batch: EventBatch) -> bytes:
    import msgpack  # heavy optional import, kept off `kvstrata --help`

    return msgpack.packb([batch.ts, [encode_event(e) for e in batch.events], batch.data_parallel_rank])


def decode_batch(payload: bytes) -> EventBatch:
    """Inverse of `encode_batch`; also reads a two-field [ts, events] batch (no rank).

    Extra trailing fields of an event (newer publishers append some) are ignored."""
    import msgpack

    raw = msgpack.unpackb(payload, strict_map_key=False)
    if not isinstance(raw, list) or len(raw) < 2:
        raise ValueError(f"a KV event batch is an array [ts, events, dp_rank], got {type(raw).__name__}")
    events: list[Event] = []
    for item in raw[1]:
        cls = _EVENT_TYPES.get(item[0]) if isinstance(item, list) and item else None
        if cls is None:
            raise ValueError(f"unknown KV event {item!r:.80}")
        n = len(cls._fields)  # type: ignore[attr-defined]
        values = list(item[1 : 1 + n]) + [None] * max(0, n - (len(item) - 1))
        events.append(cls(*values))
    return EventBatch(float(raw[0]), events, raw[2] if len(raw) > 2 else None)


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=True)


def seq_from_bytes(data: bytes) -> int:
    return int.from_bytes(data, "big", signed=True)

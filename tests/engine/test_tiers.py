"""KV tiers inside the engine: greedy output is the same whether a prefix came from L1, L2, L3 or
was computed; a restart serves the prefix from L3; bad stored values are misses; a store that dies
or crawls costs hits, never a request; closing flushes to the store the pages it missed.
Tiny random-weight model (float32), plus one SmolLM2 check."""
from __future__ import annotations

import json
import logging
import random
import threading
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from store_servers import redis_server

from kvstrata.engine.engine import Engine
from kvstrata.engine.llm import LLM
from kvstrata.engine.sampling_params import RequestStats, SamplingParams
from kvstrata.kv.store import register_store
from kvstrata.kv.store.file_store import FileStore

PS = 16
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
A = 100  # prompt tokens: 6 full pages (96 tokens) can come from a cache


class Result(NamedTuple):
    tokens: list[int]
    stats: RequestStats
    finish_reason: str | None

    @property
    def tiers(self) -> dict[str, int]:
        return self.stats.tier_tokens


def tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 49000) for _ in range(n)]


def make(model: Path, store: dict[str, Any] | None = None, backend: str = "file", **kw: Any) -> Engine:
    kw.setdefault("dtype", "float32")
    kw.setdefault("max_total_tokens", 12 * PS)  # 12 pages: a 170-token request evicts the rest
    if store is not None:
        kw.update(kvstore_storage_backend=backend, kvstore_storage_backend_extra_config=json.dumps(store))
    return LLM(str(model), **kw).engine


def run(eng: Engine, prompts: dict[str, list[int]], params: SamplingParams = GREEDY) -> dict[str, Result]:
    for rid, p in prompts.items():
        eng.add_request(rid, p, params)
    return finish(eng)


def finish(eng: Engine, acc: dict[str, list[int]] | None = None) -> dict[str, Result]:
    acc = acc if acc is not None else {}
    done: dict[str, Result] = {}
    while eng.has_unfinished():
        for o in eng.step():
            acc.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.finished:
                done[o.request_id] = Result(acc[o.request_id], o.stats, o.finish_reason)
        eng.check_integrity()
    return done


def test_same_output_from_l1_l2_l3_or_computed(tiny_model_dir: Path, tmp_path: Path) -> None:
    store = {"path": str(tmp_path / "kvstore")}
    a, b = tokens(A, 1), tokens(170, 2)
    eng = make(tiny_model_dir, store)
    cold = run(eng, {"a": a})["a"]
    assert cold.tiers == {"device": 0, "host": 0, "store": 0}
    l1 = run(eng, {"a": a})["a"]
    # 96 tokens of full pages, then the part page the cold run left (kv/tail_pages.py) up to the last token
    assert l1.tiers == {"device": A - 1, "host": 0, "store": 0} and l1.tokens == cold.tokens
    run(eng, {"b": b})  # needs all 12 L1 pages: every page of `a` goes to L2
    l2 = run(eng, {"a": a})["a"]
    assert l2.tiers == {"device": 0, "host": 96, "store": 0} and l2.tokens == cold.tokens
    eng.flush_cache()  # L1 and L2 empty; L3 keeps everything
    l3 = run(eng, {"a": a})["a"]
    assert l3.tiers == {"device": 0, "host": 0, "store": 96} and l3.tokens == cold.tokens
    snap = eng.tiers.stats.snapshot()
    assert snap.reads["host"] >= 12 and snap.writes["store"] >= 6 and snap.reads["store"] == 6
    assert snap.prefetch == {"started": 1, "completed": 1} and snap.errors == {}
    eng.close()

    restarted = make(tiny_model_dir, store)  # a new process on the same store directory
    after = run(restarted, {"a": a})["a"]
    assert after.tiers == {"device": 0, "host": 0, "store": 96} and after.tokens == cold.tokens
    restarted.close()

    # one page a store read: the prefix reaches L2 read by read (each put there as it arrives), each page once
    batched = make(tiny_model_dir, store, kvstore_prefetch_batch_pages=1)
    after = run(batched, {"a": a})["a"]
    assert after.tiers == {"device": 0, "host": 0, "store": 96} and after.tokens == cold.tokens
    snap = batched.tiers.stats.snapshot()
    assert snap.reads["store"] == 6 and snap.writes["host"] == 6 and snap.prefetch == {"started": 1, "completed": 1}
    batched.close()


def test_corrupt_and_foreign_values_are_misses_then_healed(tiny_model_dir: Path, tmp_path: Path) -> None:
    store = {"path": str(tmp_path / "kvstore")}
    a = tokens(A, 3)
    eng = make(tiny_model_dir, store)
    cold = run(eng, {"a": a})["a"]
    eng.close()
    files = sorted(p for p in (tmp_path / "kvstore").rglob("*") if p.is_file())
    assert len(files) == 6
    originals = {f: f.read_bytes() for f in files}

    for f in files:  # one flipped payload byte in every value
        data = bytearray(originals[f])
        data[len(data) // 2] ^= 0x01
        f.write_bytes(bytes(data))
    eng = make(tiny_model_dir, store)
    got = run(eng, {"a": a})["a"]
    assert got.tiers["store"] == 0 and got.tokens == cold.tokens
    assert eng.tiers.stats.snapshot().errors == {("file", "corrupt"): 1}
    eng.close()  # recomputing `a` overwrote the distrusted values
    healed = make(tiny_model_dir, store)
    assert run(healed, {"a": a})["a"].tiers["store"] == 96
    healed.close()

    for f, g in zip(files, files[1:] + files[:1]):  # every value under another page's key
        f.write_bytes(originals[g])
    eng = make(tiny_model_dir, store)
    got = run(eng, {"a": a})["a"]
    assert got.tiers["store"] == 0 and got.tokens == cold.tokens
    assert eng.tiers.stats.snapshot().errors == {("file", "foreign"): 1}
    eng.close()


def test_redis_stopped_mid_load_fails_no_request(
    tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    system = tokens(64, 4)
    first = {f"s{i}": system + tokens(20 + 3 * i, 10 + i) for i in range(4)}
    ref_engine = make(tiny_model_dir, enable_prefix_caching=False, max_total_tokens=4096)
    ref1 = run(ref_engine, first)
    second = {f"s{i}": p + ref1[f"s{i}"].tokens + tokens(30, 20 + i) for i, p in enumerate(first.values())}
    ref2 = run(ref_engine, second)
    with redis_server() as server, caplog.at_level(logging.WARNING, logger="kvstrata.kv.store.guard"):
        eng = make(tiny_model_dir, {"url": server.url}, backend="redis", max_total_tokens=40 * PS)
        got1 = run(eng, first)
        assert eng.tiers.writer.drain(5.0) and eng.tiers.stats.snapshot().writes["store"] >= 4 + 4
        eng.flush_cache()  # the next turns can only find their history in Redis
        for rid, p in second.items():
            eng.add_request(rid, p, GREEDY)
        acc: dict[str, list[int]] = {}
        for _ in range(2):
            for o in eng.step():
                acc.setdefault(o.request_id, []).extend(o.new_token_ids)
        server.stop()
        got2 = finish(eng, acc)
        eng.close(drain_timeout_s=1.0)
    assert {r: g.tokens for r, g in got1.items()} == {r: g.tokens for r, g in ref1.items()}
    assert {r: g.tokens for r, g in got2.items()} == {r: g.tokens for r, g in ref2.items()}
    assert all(g.finish_reason == "length" for g in got2.values())
    errors = eng.tiers.stats.snapshot().errors
    assert errors and all(backend == "redis" for backend, _ in errors)
    assert len([r for r in caplog.records if "kvstore_error" in r.getMessage()]) == 1  # one per minute


class SlowFileStore(FileStore):
    """A file store whose reads take `delay_s` (until closed); `returned` counts the reads that came back,
    `returned_at_close` what it was when `close` was called. `opened` lists every instance."""

    opened: list[SlowFileStore] = []

    def __init__(self, path: str, delay_s: float) -> None:
        super().__init__(path)
        self.delay_s = delay_s
        self._closed = threading.Event()
        self.returned = 0
        self.returned_at_close: int | None = None
        SlowFileStore.opened.append(self)

    def batch_get(self, keys: list[str]) -> list[bytes | None]:
        self._closed.wait(self.delay_s)
        try:
            return super().batch_get(keys)
        finally:
            self.returned += 1

    def close(self) -> None:
        self.returned_at_close = self.returned
        self._closed.set()


def test_slow_store_prefetch_deadline_holds_and_others_keep_running(tiny_model_dir: Path, tmp_path: Path) -> None:
    register_store("slow_file", SlowFileStore)
    path = str(tmp_path / "kvstore")
    a = tokens(A, 5)
    writer = make(tiny_model_dir, {"path": path})
    cold = run(writer, {"a": a})["a"]
    writer.close()
    base, per_page = 0.3, 0.01
    eng = make(
        tiny_model_dir, {"path": path, "delay_s": 30.0}, backend="slow_file", max_total_tokens=40 * PS,
        kvstore_prefetch_timeout_base_s=base, kvstore_prefetch_timeout_per_page_s=per_page,
    )
    eng.add_request("y", tokens(20, 6), SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True))
    eng.step()
    eng.add_request("a", a, GREEDY)
    assert eng.tiers is not None and eng.tiers.prefetcher is not None
    store = SlowFileStore.opened[-1]
    y_tokens_while_a_prefetches = 0
    reads_back_when_a_finished = -1
    acc: dict[str, list[int]] = {}
    done: dict[str, Result] = {}
    while eng.has_unfinished():
        for o in eng.step():
            acc.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.request_id == "y" and "a" not in acc and eng.tiers.prefetcher.num_pending:
                y_tokens_while_a_prefetches += len(o.new_token_ids)  # a step came back with a's read in flight
            if o.finished:
                done[o.request_id] = Result(acc[o.request_id], o.stats, o.finish_reason)
                if o.request_id == "a":
                    reads_back_when_a_finished = store.returned
                    eng.abort_request("y")  # its part is done: close right after, well within the read's delay
    got = done["a"]
    assert reads_back_when_a_finished == 0  # "a" ran to its end while no read from the store had come back ...
    assert eng.tiers.stats.snapshot().prefetch == {"started": 1, "timeouts": 1}  # ... let in by the deadline
    assert y_tokens_while_a_prefetches >= 1  # the running request kept decoding meanwhile: no step waited for it
    assert got.tiers["store"] == 0 and got.tokens == cold.tokens
    eng.close()
    assert store.returned_at_close == 0  # closing did not wait for the stuck read


class SwitchFileStore(FileStore):
    """A file store that can be switched off: every call raises while `down` (a dead server)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.down = False
        self.refused = 0  # calls that reached it while down

    def batch_exists(self, keys: list[str]) -> int:
        if self.down:
            self.refused += 1
            raise ConnectionError("store is down")
        return super().batch_exists(keys)

    def batch_put(self, keys: list[str], values: list[bytes]) -> None:
        if self.down:
            self.refused += 1
            raise ConnectionError("store is down")
        super().batch_put(keys, values)


def test_close_flushes_the_l1_and_l2_pages_the_store_missed(tiny_model_dir: Path, tmp_path: Path) -> None:
    register_store("switch_file", SwitchFileStore)
    store = {"path": str(tmp_path / "kvstore")}
    a, b = tokens(A, 7), tokens(170, 8)
    eng = make(tiny_model_dir, store, backend="switch_file")
    assert eng.tiers is not None and eng.tiers.writer is not None
    eng.tiers.writer.store.store.down = True  # every write-through fails
    cold_a = run(eng, {"a": a})["a"]
    cold_b = run(eng, {"b": b})["b"]  # all 12 L1 pages: `a` now lives only in L2
    assert eng.tiers.writer.drain(5.0)  # every write-through tried (and failed) while the store was down
    assert not list((tmp_path / "kvstore").rglob("*"))
    eng.tiers.writer.store.store.down = False  # back, but nothing is written until the flush
    report = eng.tiers.close(5.0)
    assert report is not None and report.l1_pages == 11 and report.l2_pages == 6  # b: 182 tokens, a: 6 pages
    assert report.flushed == 17 and report.skipped == 0 and report.drained
    restarted = make(tiny_model_dir, store)
    after = run(restarted, {"a": a}) | run(restarted, {"b": b})
    assert after["a"].tiers == {"device": 0, "host": 0, "store": 96} and after["a"].tokens == cold_a.tokens
    assert after["b"].tiers["store"] == 160 and after["b"].tokens == cold_b.tokens
    restarted.close()


def test_close_with_a_dead_store_skips_the_flush_within_the_timeout(tiny_model_dir: Path, tmp_path: Path) -> None:
    register_store("switch_file", SwitchFileStore)
    eng = make(tiny_model_dir, {"path": str(tmp_path / "kvstore")}, backend="switch_file")
    assert eng.tiers is not None and eng.tiers.writer is not None
    dead = eng.tiers.writer.store.store
    dead.down = True
    run(eng, {"a": tokens(A, 9)})
    refused = dead.refused
    report = eng.tiers.close(1.0)
    assert report is not None and report.l1_pages == 6 and report.flushed == 0 and report.skipped == 6
    assert dead.refused - refused <= 1  # the flush did not write page after page into a dead store


@pytest.mark.slow
def test_smollm2_prefix_from_l2_and_l3_gives_the_computed_output(smollm2_path: Path, tmp_path: Path) -> None:
    store = {"path": str(tmp_path / "kvstore")}
    kw = dict(dtype="float32", max_total_tokens=16 * PS)
    eng = make(smollm2_path, store, **kw)
    text = "The history of the river begins in the mountains, where snow melts every spring. " * 20
    a = eng.tokenizer.encode(text)[:120]
    b = eng.tokenizer.encode("A recipe for bread: flour, water, salt and yeast, mixed and left to rise. " * 30)[:200]
    assert (len(a), len(b)) == (120, 200)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    cold = run(eng, {"a": a}, params)["a"]
    run(eng, {"b": b}, params)  # pushes `a` out of L1
    l2 = run(eng, {"a": a}, params)["a"]
    assert l2.tiers["host"] > 0 and l2.tiers["device"] + l2.tiers["host"] == 112 and l2.tokens == cold.tokens
    eng.close()
    restarted = make(smollm2_path, store, **kw)
    l3 = run(restarted, {"a": a}, params)["a"]
    assert l3.tiers == {"device": 0, "host": 0, "store": 112} and l3.tokens == cold.tokens
    restarted.close()

"""Two independent `kvstrata serve` processes ("two machines": own ports, own L1/L2) sharing one L3
store: one real redis-server, and separately one real mooncake_master.

- the same prompt computed by each server alone gives the same store keys holding the same bytes;
- a long prefix computed on A is served to B from L3 (cached_tokens, B's store-tier hits), with
  the same greedy output;
- A and B writing the same pages at once both succeed, and the pages read back whole;
- B restarting mid-run (while A keeps serving) finds the shared pages again (with Mooncake, only
  those not held in the memory the old B lent to the cluster).
"""
from __future__ import annotations

import json
import random
import signal
import threading
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvstrata.kv.hashing import hash_pages
from kvstrata.kv.store.registry import create_store
from kvstrata.serving.ports import free_port
from proc_support import KvstrataProcess, wait_for
from store_servers import mooncake_master, mooncake_unavailable, redis_server

PAGE = 16
PROMPT_TOKENS = 1024


def _prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(300, 40000) for _ in range(PROMPT_TOKENS)]


@pytest.fixture(params=["redis", "mooncake"])
def store(request: pytest.FixtureRequest) -> Iterator[tuple[str, dict[str, Any]]]:
    if request.param == "redis":
        with redis_server() as server:
            yield "redis", {"url": server.url}
        return
    assert mooncake_unavailable() is None, mooncake_unavailable()
    with mooncake_master() as address:
        yield "mooncake", {"master_server_address": address, "global_segment_size": 64 * 2**20,
                           "local_buffer_size": 32 * 2**20}


class Machine:
    """One `kvstrata serve` process with the shared L3 store."""

    def __init__(self, name: str, model: Path, backend: str, config: dict[str, Any], logs: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = KvstrataProcess([
            "serve", "--model", str(model), "--dtype", "float32", "--port", str(self.port), "--num-threads", "1",
            "--max-total-tokens", "4096", "--max-model-len", "2048", "--kvstore-storage-backend", backend,
            "--kvstore-storage-backend-extra-config", json.dumps(config), "--log-level", "info",
        ], logs / f"{name}-{self.port}.log")

    def ready(self) -> Machine:
        self.proc.wait_healthy(self.url)
        return self

    def complete(self, prompt: list[int]) -> dict[str, Any]:
        body = {"prompt": prompt, "max_tokens": 4, "temperature": 0}
        resp = httpx.post(self.url + "/v1/completions", json=body, timeout=300)
        assert resp.status_code == 200, resp.text
        return resp.json()

    def store_hits(self) -> float:
        text = httpx.get(self.url + "/metrics").text
        return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
                   if s.name == "kvstrata:prefix_cache_hits_total" and s.labels.get("tier") == "store")

    def stop(self) -> None:
        if self.proc.proc.poll() is None:
            self.proc.proc.send_signal(signal.SIGTERM)
            self.proc.proc.wait(timeout=120)
        self.proc.close()


def test_two_servers_share_pages_through_l3(
    store: tuple[str, dict[str, Any]], tiny_model_dir: Path, tmp_path: Path
) -> None:
    backend, config = store
    client = create_store(backend, config)
    a = Machine("a", tiny_model_dir, backend, config, tmp_path)
    b = Machine("b", tiny_model_dir, backend, config, tmp_path)
    machines = [a, b]
    try:
        a.ready(), b.ready()
        infos = [httpx.get(m.url + "/server_info").json() for m in (a, b)]
        assert infos[0]["kv_namespace"] == infos[1]["kv_namespace"]  # same model, dtype, page size
        root = bytes.fromhex(infos[0]["kv_namespace"])
        assert f"kv_namespace={root.hex()[:16]}" in a.proc.text()  # the startup line says it

        def keys(prompt: list[int]) -> list[str]:
            return [h.hex() for h in hash_pages(prompt, PAGE, root)]

        def written(prompt: list[int]) -> None:
            wait_for(lambda: client.batch_exists(keys(prompt)) == PROMPT_TOKENS // PAGE, "pages in L3")

        # 1. a computes p1; with redis, its pages are then deleted and b computes p1 alone: the same
        #    keys hold the same bytes (mooncake never deletes, so there only a's copy is compared below)
        p1 = _prompt(1)
        first = a.complete(p1)
        written(p1)
        values_a = client.batch_get(keys(p1))
        assert all(v is not None for v in values_a)
        if backend == "redis":
            import redis

            assert redis.Redis.from_url(config["url"]).delete(*[client.prefix + k for k in keys(p1)]) == len(keys(p1))
            alone = b.complete(p1)
            assert alone["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            written(p1)
            assert client.batch_get(keys(p1)) == values_a  # b's pages are a's pages, byte for byte
            assert alone["choices"][0]["text"] == first["choices"][0]["text"]
        # 2. a long prefix computed on a is served from L3 on b, and the other way round
        p2 = _prompt(2)
        first = a.complete(p2)
        written(p2)
        values_p2 = client.batch_get(keys(p2))
        hits = b.store_hits()
        on_b = b.complete(p2)
        assert on_b["usage"]["prompt_tokens_details"]["cached_tokens"] == PROMPT_TOKENS - PAGE
        assert b.store_hits() - hits == PROMPT_TOKENS - PAGE  # every cached token came from the store
        assert on_b["choices"][0]["text"] == first["choices"][0]["text"]
        assert client.batch_get(keys(p2)) == values_p2  # b put nothing different back
        if backend == "mooncake":
            hits = b.store_hits()
            assert b.complete(p1)["usage"]["prompt_tokens_details"]["cached_tokens"] == PROMPT_TOKENS - PAGE
            assert b.store_hits() - hits == PROMPT_TOKENS - PAGE
        # 3. both compute p3 at once: two writers of the same pages
        p3 = _prompt(3)
        outs: dict[str, Any] = {}
        threads = [threading.Thread(target=lambda m=m: outs.setdefault(m.url, m.complete(p3))) for m in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len({o["choices"][0]["text"] for o in outs.values()}) == 1
        written(p3)
        # 4. b restarts while a keeps serving; the new b finds p3 in L3
        stop = threading.Event()
        served: list[int] = []

        def keep_serving() -> None:
            for i in range(1000):
                if stop.is_set():
                    return
                served.append(len(a.complete(_prompt(100 + i % 3)[:200])["choices"]))

        load = threading.Thread(target=keep_serving)
        load.start()
        try:
            b.stop()
            b = Machine("b2", tiny_model_dir, backend, config, tmp_path)
            machines.append(b)
            b.ready()
            again = b.complete(p3)
        finally:
            stop.set()
            load.join()
        assert served and all(n == 1 for n in served)  # a served throughout
        cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
        if backend == "redis":
            assert cached == PROMPT_TOKENS - PAGE
        else:  # Mooncake keeps objects in the memory its clients lend: the old b's share left with it
            assert cached % PAGE == 0 and cached < PROMPT_TOKENS
        assert b.store_hits() == cached  # whatever b had, it had from the store
        assert again["choices"][0]["text"] == outs[a.url]["choices"][0]["text"]
        now = client.batch_get(keys(p1))
        if backend == "redis":
            assert now == values_a  # nothing rewrote a's pages
        else:  # a page is a's bytes or gone with the old b's lent memory, never different bytes
            assert all(v is None or v == w for v, w in zip(now, values_a))
    finally:
        for m in machines:
            m.stop()
        client.close()

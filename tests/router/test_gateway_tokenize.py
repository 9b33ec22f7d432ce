"""/tokenize and /detokenize through the real gateway, in front of two real rank servers in this process
(one tiny engine behind both): the rank's answer comes back as it is, from the least-loaded ready rank,
from the other rank when one is gone, with the client's key, and 503 when none is ready."""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from kvstrata.config import CacheConfig, ModelConfig, SchedulerConfig
from kvstrata.config_server import RouterConfig, ServerConfig
from kvstrata.engine.async_engine import AsyncEngine
from kvstrata.router.app import GatewayThread
from kvstrata.serving.ports import free_port
from kvstrata.serving.server import ServerThread
from kvstrata.serving.state import ServerState

PROMPT = "the quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[AsyncEngine]:
    cfg = ModelConfig(model=str(tiny_model_dir), dtype="float32", max_model_len=256, num_threads=1)
    eng = AsyncEngine.from_config(cfg, CacheConfig(max_total_tokens=1024, page_size=16), SchedulerConfig())
    yield eng
    eng.shutdown()


def rank(engine: AsyncEngine, server_cfg: ServerConfig | None = None) -> ServerThread:
    state = ServerState(ModelConfig(), CacheConfig(), SchedulerConfig(), server_cfg or ServerConfig(port=0))
    state.publish(engine)
    return ServerThread(state).start()


def wait_ready(gw: GatewayThread, ranks: int) -> None:
    deadline = time.monotonic() + 30
    while len(gw.gateway.pool.ready()) < ranks:
        assert time.monotonic() < deadline, [w.status for w in gw.gateway.pool.workers]
        time.sleep(0.05)


def test_any_ready_rank_answers_as_it_would_itself(engine: AsyncEngine) -> None:
    ranks = [rank(engine), rank(engine)]
    gw = GatewayThread([r.base_url for r in ranks], RouterConfig(policy="least_load", health_check_interval=0.1))
    gw.start()
    try:
        wait_ready(gw, 2)
        with httpx.Client(base_url=gw.base_url, timeout=30) as http:
            direct = httpx.post(ranks[0].base_url + "/tokenize", json={"prompt": PROMPT}, timeout=30).json()
            resp = http.post("/tokenize", json={"prompt": PROMPT})
            assert resp.status_code == 200 and resp.json() == direct
            assert direct["tokens"] == engine.tokenizer.encode(PROMPT, add_special_tokens=True)
            back = http.post("/detokenize", json={"tokens": direct["tokens"]})
            assert back.status_code == 200 and back.json() == {"prompt": PROMPT}
            bad = http.post("/detokenize", json={"tokens": [-1]})  # the rank's refusal, as it wrote it
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"

            gw.gateway.pool.workers[0].tokens = 1000  # rank 0 busy with routed requests: rank 1 answers
            assert http.post("/tokenize", json={"prompt": PROMPT}).headers["x-kvstrata-rank"] == "1"
            gw.gateway.pool.workers[0].tokens = 0
            assert all(w.requests == 0 for w in gw.gateway.pool.workers)  # a tokenize is not routed load

            gw.gateway.cfg = replace(gw.gateway.cfg, health_check_interval=600)  # the prober sleeps from here on
            time.sleep(0.5)
            ranks[0].stop()  # gone, and the prober has not seen it: the request finds out and moves on to rank 1
            assert gw.gateway.pool.workers[0].ready
            resp = http.post("/tokenize", json={"prompt": PROMPT})
            assert resp.status_code == 200 and resp.json() == direct and resp.headers["x-kvstrata-rank"] == "1"
            assert gw.gateway.pool.workers[0].status == "down"
    finally:
        gw.stop()
        for r in ranks[1:]:
            r.stop()


def test_the_gateway_asks_for_a_key_and_hands_it_to_the_rank(engine: AsyncEngine) -> None:
    keyed = ServerConfig(port=0, api_key=("sk-k",))
    r = rank(engine, keyed)
    gw = GatewayThread([r.base_url], RouterConfig(policy="least_load", health_check_interval=0.1), keyed)
    gw.start()
    try:
        wait_ready(gw, 1)
        with httpx.Client(base_url=gw.base_url, timeout=30) as http:
            for path, body in (("/tokenize", {"prompt": "x"}), ("/detokenize", {"tokens": [1]})):
                refused = http.post(path, json=body)
                assert refused.status_code == 401 and "x-kvstrata-rank" not in refused.headers  # the gateway's own
                resp = http.post(path, json=body, headers={"Authorization": "Bearer sk-k"})  # the rank wants it too
                assert resp.status_code == 200 and resp.headers["x-kvstrata-rank"] == "0", resp.text
    finally:
        gw.stop()
        r.stop()


def test_no_ready_rank_is_a_503() -> None:
    nobody = f"http://127.0.0.1:{free_port()}"  # a port nothing listens on
    gw = GatewayThread([nobody], RouterConfig(policy="least_load", health_check_interval=0.1))
    gw.start()
    try:
        with httpx.Client(base_url=gw.base_url, timeout=30) as http:
            for path, body in (("/tokenize", {"prompt": "x"}), ("/detokenize", {"tokens": [1]})):
                resp = http.post(path, json=body)
                assert resp.status_code == 503 and resp.json()["error"]["code"] == "no_rank_ready", resp.text
    finally:
        gw.stop()

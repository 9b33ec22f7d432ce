"""Two real rank processes (tiny model, float32) behind the real gateway: sessions stick, pinning
works, /metrics and /health speak for every rank, and a killed rank costs no request that had not
started streaming (then comes back, restarted by the supervisor)."""
from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvstrata.config import CacheConfig, ModelConfig, SchedulerConfig
from kvstrata.config_server import RouterConfig, ServerConfig
from kvstrata.router.app import GatewayThread
from kvstrata.router.launcher import RankSupervisor, rank_specs
from kvstrata.router.policy import make_policy
from kvstrata.serving.ports import free_port
from polling import wait_for

WORDS = "alpha beta gamma delta tool schema json call result weather city price search file read".split()


class Cluster:
    def __init__(self, supervisor: RankSupervisor, gateway: GatewayThread) -> None:
        self.supervisor = supervisor
        self.gw = gateway
        self.http = httpx.Client(base_url=gateway.base_url, timeout=600)  # a loaded machine is slow, not wrong

    def health(self) -> dict[str, Any]:
        return self.http.get("/health").json()

    def wait_ready(self, ranks: int = 2, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            body = self.health()
            ready = sum(r["status"] == "ready" for r in body["ranks"])
            if ready == ranks and self.gw.gateway.hasher is not None:
                return
            time.sleep(0.2)
        raise AssertionError(f"ranks not ready in {timeout}s: {self.health()}")

    def chat(self, messages: list[dict[str, str]], **extra: Any) -> httpx.Response:
        body = {"messages": messages, "max_tokens": 8, "temperature": 0, **extra}
        return self.http.post("/v1/chat/completions", json=body)


@pytest.fixture(scope="module")
def cluster(tiny_model_dir: Path) -> Iterator[Cluster]:
    model_cfg = ModelConfig(model=str(tiny_model_dir), dtype="float32", max_model_len=2048, num_threads=1)
    cache_cfg = CacheConfig(max_total_tokens=8192, page_size=16)
    router_cfg = RouterConfig(health_check_interval=0.2)
    server_cfg = ServerConfig(port=free_port(), log_level="warning")
    supervisor = RankSupervisor(rank_specs(2, model_cfg, cache_cfg, SchedulerConfig(), server_cfg, router_cfg))
    supervisor.start()
    gateway = GatewayThread(supervisor.urls, router_cfg).start()
    c = Cluster(supervisor, gateway)
    try:
        c.wait_ready()
        yield c
    finally:
        c.http.close()
        gateway.stop()
        supervisor.stop()


def scrape(http: httpx.Client) -> dict[tuple[str, str | None], float]:
    """GET /metrics as {(sample name, rank label): value}."""
    return {
        (s.name, s.labels.get("rank")): s.value
        for fam in text_string_to_metric_families(http.get("/metrics").text)
        for s in fam.samples
    }


def system_prompt(seed: int, words: int = 160) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def rank_of(resp: httpx.Response) -> int:
    assert resp.status_code == 200, resp.text
    return int(resp.headers["x-kvstrata-rank"])


def test_sessions_stick_to_the_rank_that_holds_their_history(cluster: Cluster) -> None:
    histories = [[{"role": "system", "content": system_prompt(s)}] for s in range(4)]
    ranks: list[list[int]] = [[] for _ in histories]
    cached: list[list[int]] = [[] for _ in histories]
    for turn in range(3):
        for s, history in enumerate(histories):  # sessions interleave, as agents do
            history.append({"role": "user", "content": f"session {s} turn {turn}: " + system_prompt(100 + turn, 20)})
            resp = cluster.chat(history)
            ranks[s].append(rank_of(resp))
            cached[s].append(resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
            history.append({"role": "assistant", "content": resp.json()["choices"][0]["message"]["content"]})
    assert all(len(set(r)) == 1 for r in ranks), ranks  # every turn of a session on one rank
    assert {r[0] for r in ranks} == {0, 1}, ranks  # new sessions spread over both ranks
    assert all(c[0] == 0 and c[1] > 100 and c[2] > c[1] for c in cached), cached
    def index_holds_what_the_ranks_cache() -> bool:  # once the last events reached the gateway
        pages, ranks = scrape(cluster.http), cluster.health()["ranks"]
        return all(ranks[r]["cached_blocks"] == pages.get(("kvstrata:prefix_cache_pages", str(r))) for r in (0, 1))

    assert wait_for(index_holds_what_the_ranks_cache)
    metrics = scrape(cluster.http)
    health = cluster.health()
    for r in (0, 1):  # the gateway's index holds exactly as many pages as the rank's cache
        assert health["ranks"][r]["kv_events"] == "on"
        assert health["ranks"][r]["cached_blocks"] == metrics[("kvstrata:prefix_cache_pages", str(r))] > 0
    routed = {k: v for k, v in metrics.items() if k[0] == "kvstrata:router_requests_total"}
    assert sum(routed.values()) >= 12 and {k[1] for k in routed} == {"0", "1"}
    assert metrics[("kvstrata:router_match_ratio_count", None)] >= 12
    assert health["overhead_ms"]["count"] >= 12


def test_pinning_and_bad_ranks(cluster: Cluster) -> None:
    messages = [{"role": "user", "content": system_prompt(7, 30)}]
    assert [rank_of(cluster.chat(messages, data_parallel_rank=r)) for r in (1, 0, 1)] == [1, 0, 1]
    for bad in (2, -1, True, "1"):
        resp = cluster.chat(messages, data_parallel_rank=bad)
        assert resp.status_code == 400, resp.text
        err = resp.json()["error"]
        assert err["param"] == "data_parallel_rank" and err["type"] == "invalid_request_error"
    models = cluster.http.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["object"] == "model"


def test_streams_pass_through_unbuffered(cluster: Cluster) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 200, "ignore_eos": True,
            "temperature": 0, "stream": True}
    def running() -> float:
        total = 0.0
        for url in cluster.supervisor.urls:
            with httpx.Client(base_url=url, timeout=10) as rank:
                total += scrape(rank).get(("kvstrata:num_requests_running", None), 0)
        return total

    lines: list[str] = []
    running_at_first: float | None = None
    with cluster.http.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith("data:"):
                if running_at_first is None:  # the first chunk is here: is the request still running?
                    running_at_first = running()
                lines.append(line)
    assert lines[-1] == "data: [DONE]" and len(lines) > 20  # a verify step streams its accepted tokens in one chunk
    assert running_at_first == 1  # the gateway passed the first chunk on while the rank was still generating


def test_killed_rank_loses_no_request_that_had_not_started_streaming(cluster: Cluster) -> None:
    history = [{"role": "system", "content": system_prompt(42)}, {"role": "user", "content": "go"}]
    assert rank_of(cluster.chat(history, data_parallel_rank=1)) == 1  # rank 1 now holds this prefix
    history.append({"role": "user", "content": "and again"})
    long = {"max_tokens": 1600, "ignore_eos": True}
    result: dict[str, httpx.Response] = {}
    worker = threading.Thread(target=lambda: result.setdefault("r", cluster.chat(history, **long)))
    worker.start()  # a non-streaming request: the client sees no byte until it ends
    with httpx.Client(base_url=cluster.supervisor.urls[1], timeout=10) as rank1:
        assert wait_for(lambda: scrape(rank1).get(("kvstrata:num_requests_running", None), 0) == 1)
    victim = cluster.supervisor.specs[1].process
    assert cluster.gw.gateway.pool.workers[1].requests == 1  # it is running on rank 1
    os.kill(victim.pid, signal.SIGKILL)
    worker.join()  # until the retried request has its answer (pytest-timeout bounds a hang)
    assert rank_of(result["r"]) == 0  # retried on rank 0, whole
    assert result["r"].json()["usage"]["completion_tokens"] == 1600
    for _ in range(3):  # the session's next turns, and new ones, go to the live rank
        assert rank_of(cluster.chat(history)) == 0
    retries = [
        s.value for fam in text_string_to_metric_families(cluster.http.get("/metrics").text) for s in fam.samples
        if s.name == "kvstrata:router_retries_total" and s.labels["rank"] == "1"
    ]
    assert retries == [1.0]
    cluster.wait_ready(timeout=60)  # the supervisor restarted it
    assert cluster.supervisor.specs[1].process.pid != victim.pid
    assert rank_of(cluster.chat(history, data_parallel_rank=1)) == 1


def test_prompt_cache_key_lands_on_one_rank_and_ranks_stay_balanced(cluster: Cluster) -> None:
    """8 keys x 3 requests with unrelated prompts (so no cached match groups them), sent 4 at a time, by
    `cache_aware` (whose stickiness is SGLang's balance thresholds; by `cost`, the default, a key whose few
    tokens of history queue behind more than that moves: tests/router/test_key_affinity.py): every key's
    requests land on one rank, keys spread over both ranks, and nothing moved (the loads never passed the
    balance thresholds)."""
    gateway = cluster.gw.gateway
    default = gateway.policy
    gateway.policy = make_policy(RouterConfig(policy="cache_aware"))
    try:
        check_keys_stick(cluster)
    finally:
        gateway.policy = default


def check_keys_stick(cluster: Cluster) -> None:
    seen: dict[str, set[int]] = {}
    lock = threading.Lock()

    def send(key: str, i: int) -> None:
        messages = [{"role": "user", "content": f"{key} {i} " + system_prompt(hash((key, i)) % 10_000, 40)}]
        rank = rank_of(cluster.chat(messages, prompt_cache_key=key, prompt_cache_retention="in_memory"))
        with lock:
            seen.setdefault(key, set()).add(rank)

    jobs = [(f"agent-{k}", i) for i in range(3) for k in range(8)]
    for start in range(0, len(jobs), 4):
        threads = [threading.Thread(target=send, args=job) for job in jobs[start : start + 4]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(seen) == 8 and all(len(ranks) == 1 for ranks in seen.values()), seen
    per_rank = [sum(ranks == {r} for ranks in seen.values()) for r in (0, 1)]
    assert min(per_rank) >= 2, per_rank  # new keys go to the least-loaded rank: both ranks get keys
    assert cluster.gw.gateway.affinity.moves == 0
    bad = cluster.chat([{"role": "user", "content": "hi"}], prompt_cache_key="k" * 1025)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt_cache_key"


def test_claude_code_sessions_stick_through_the_gateway(cluster: Cluster) -> None:
    """/v1/messages through the gateway with the real Anthropic SDK: each session (its
    X-Claude-Code-Session-Id) stays on one rank, sessions spread over both, and a later turn reads its
    history from that rank's cache."""
    import anthropic

    client = anthropic.Anthropic(base_url=cluster.gw.base_url, api_key="x", max_retries=0, timeout=600)
    model = cluster.http.get("/v1/models").json()["data"][0]["id"]
    ranks: dict[str, set[int]] = {}
    for turn in range(2):
        for s in range(4):
            session = f"session-{s}"
            history = [{"role": "user", "content": f"{session} " + system_prompt(500 + s, 60)}]
            if turn:
                history += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "and then?"}]
            raw = client.messages.with_raw_response.create(
                model=model, max_tokens=4, messages=history,  # type: ignore[arg-type]
                extra_headers={"X-Claude-Code-Session-Id": session})
            ranks.setdefault(session, set()).add(int(raw.headers["x-kvstrata-rank"]))
            if turn:
                assert raw.parse().usage.cache_read_input_tokens >= 48
    assert all(len(r) == 1 for r in ranks.values()), ranks
    assert set().union(*ranks.values()) == {0, 1}, ranks
    bad = cluster.http.post("/v1/messages", json={"messages": [], "max_tokens": 1})
    assert bad.status_code == 400 and bad.json()["type"] == "error"

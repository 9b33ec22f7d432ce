"""API keys through the gateway: two real rank processes started with a key file, the real gateway
in front with the same file. The gateway refuses what lacks a key itself, forwards the key so each
rank keeps tenants apart, reads the ranks' info and metrics with its own key, and serves the
dashboard (over its merged /metrics) to a browser holding the ?api_key= cookie."""
from __future__ import annotations

import os
import re
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvstrata.config import CacheConfig, ModelConfig, SchedulerConfig
from kvstrata.config_server import RouterConfig, ServerConfig
from kvstrata.router.app import GatewayThread
from kvstrata.router.launcher import RankSupervisor, rank_specs
from kvstrata.serving.auth import COOKIE
from kvstrata.serving.dashboard import dashboard_html
from kvstrata.serving.ports import free_port
from polling import wait_for

ALICE, BOB = "sk-alice-1", "sk-bob-2"
CHROMIUM = "/usr/bin/chromium"
PROMPT = "the quick brown fox jumps over the lazy dog " * 12  # ~110 tokens: several 16-token pages


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def gateway(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text(f"{ALICE} alice\n{BOB} bob\n")
    model_cfg = ModelConfig(model=str(tiny_model_dir), dtype="float32", max_model_len=1024, num_threads=1)
    router_cfg = RouterConfig(health_check_interval=0.2)
    server_cfg = ServerConfig(port=free_port(), log_level="warning", api_key_file=str(keys), response_cache_size=64)
    specs = rank_specs(2, model_cfg, CacheConfig(max_total_tokens=4096, page_size=16), SchedulerConfig(), server_cfg,
                       router_cfg)
    supervisor = RankSupervisor(specs).start()
    gw = GatewayThread(supervisor.urls, router_cfg, ServerConfig(port=0, api_key_file=str(keys))).start()
    try:
        deadline = time.monotonic() + 90
        while not (len(gw.gateway.pool.ready()) == 2 and gw.gateway.hasher is not None):  # info read with its key
            assert time.monotonic() < deadline, httpx.get(gw.base_url + "/health").text
            time.sleep(0.2)
        yield gw
    finally:
        gw.stop()
        supervisor.stop()


@pytest.fixture()
def http(gateway: GatewayThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.base_url, timeout=60) as client:
        yield client


def complete(http: httpx.Client, key: str | None, prompt: str, **extra: Any) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": 2, "temperature": 0, "data_parallel_rank": 0, **extra}
    return http.post("/v1/completions", json=body, headers=auth(key) if key else {})


def assert_401(resp: httpx.Response) -> None:
    assert resp.status_code == 401, resp.text
    assert resp.json()["error"]["code"] == "invalid_api_key"
    assert "x-kvstrata-rank" not in resp.headers  # the gateway answered; no rank saw it


def test_the_gateway_refuses_missing_and_wrong_keys(http: httpx.Client) -> None:
    assert_401(resp := complete(http, None, "hi"))
    assert resp.headers["x-kvstrata-cache"] == "bypass"
    assert_401(complete(http, "sk-wrong", "hi"))
    assert_401(http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}))
    for path in ("/v1/models", "/metrics", "/dashboard"):
        assert_401(http.get(path))
    assert_401(http.post("/flush_cache"))
    assert http.get("/health").status_code == 200  # open, as on a rank


def test_an_upgrade_is_served_as_plain_http(http: httpx.Client) -> None:
    """As on a rank (tests/serving/test_malformed.py): no WebSocket protocol, the request is answered."""
    ws = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
          "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
    assert http.get("/health", headers=ws).status_code == 200
    assert_401(http.get("/v1/models", headers=ws))


def test_a_good_key_reaches_a_rank(http: httpx.Client) -> None:
    resp = complete(http, ALICE, "hello there")
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-kvstrata-rank"] == "0"
    assert http.get("/v1/models", headers=auth(BOB)).json()["data"][0]["object"] == "model"
    assert http.post("/flush_cache", headers=auth(BOB)).json()["status"] == "ok"  # its own key on every rank


def test_tenants_share_no_cached_tokens_through_the_gateway(http: httpx.Client) -> None:
    prompt = f"{uuid.uuid4()} {PROMPT}"

    def cached(key: str) -> int:
        body = {"prompt": prompt, "max_tokens": 2, "temperature": 0, "data_parallel_rank": 0}
        resp = http.post("/v1/completions", json=body, headers={**auth(key), "Cache-Control": "no-cache"})
        assert resp.status_code == 200, resp.text
        return int(resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"])

    assert cached(ALICE) == 0
    assert cached(ALICE) >= 96  # alice hits her own pages on rank 0
    assert cached(BOB) == 0  # bob, on the same rank, does not
    assert cached(BOB) >= 96


def test_tenants_share_no_cached_response_through_the_gateway(http: httpx.Client) -> None:
    prompt = f"{uuid.uuid4()} hello"
    got = [complete(http, key, prompt).headers["x-kvstrata-cache"] for key in (ALICE, ALICE, BOB, BOB)]
    assert got == ["miss", "hit", "miss", "hit"]


def dashboard_series() -> set[str]:
    """The metric names the dashboard page reads (after its `kvstrata:` prefix is cut)."""
    html = dashboard_html()
    names = set(re.findall(r'sum\((?:m|prev|first), "(\w+)"', html)) | set(re.findall(r'm\["(\w+)"\]', html))
    names |= {h + "_bucket" for h in re.findall(r'recent\(m, "(\w+)"\)', html)}  # histograms, read by their buckets
    assert {"prefix_cache_hits_total", "time_to_first_token_seconds_bucket", "kv_cache_usage_perc",
            "request_goodput_total", "request_ttft_slack_seconds_bucket"} <= names
    return names


def test_dashboard_with_api_key_in_the_url_sets_a_cookie_that_opens_metrics(http: httpx.Client) -> None:
    for rank in (0, 1):  # labelled series (finish reasons) appear with a rank's first request
        assert complete(http, ALICE, "warm up the series", data_parallel_rank=rank).status_code == 200
    bad = http.get("/dashboard", params={"api_key": "sk-wrong"})
    assert_401(bad)
    assert "set-cookie" not in bad.headers
    page = http.get("/dashboard", params={"api_key": BOB})
    assert page.status_code == 200 and 'fetch("metrics"' in page.text
    cookie = page.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert BOB not in cookie  # a token derived from the key, not the key
    token = cookie.split(";")[0].split("=", 1)[1]
    with httpx.Client(base_url=str(http.base_url), cookies={COOKIE: token}, timeout=30) as browser:
        metrics = browser.get("/metrics")
        assert metrics.status_code == 200, metrics.text
        assert browser.get("/dashboard").status_code == 200  # no ?api_key= needed any more
        assert_401(browser.get("/v1/models"))  # the cookie opens the dashboard and its metrics only
        assert_401(browser.post("/flush_cache"))
    with httpx.Client(base_url=str(http.base_url), cookies={COOKIE: "0" * 64}) as forged:
        assert_401(forged.get("/metrics"))
    ranks: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(metrics.text):
        for s in fam.samples:
            ranks.setdefault(s.name.split(":")[-1], set()).add(s.labels.get("rank", ""))
    missing = {name for name in dashboard_series() if ranks.get(name) != {"0", "1"}}
    assert not missing, missing  # every series the page charts, from both ranks


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} not installed (apt-get install chromium)")
def test_dashboard_in_a_browser_through_the_gateway(http: httpx.Client) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (no browser download needed)")
    for rank in (0, 1):
        assert complete(http, BOB, f"browser {uuid.uuid4()}", data_parallel_rank=rank).status_code == 200
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            page.goto(f"{http.base_url}/dashboard?api_key={ALICE}")  # the address bar: no header possible
            page.wait_for_function("Number(document.getElementById('polls').textContent) >= 2", timeout=15000)
            text = lambda id_: page.locator(f"#{id_}").inner_text()  # noqa: E731
            assert text("error") == ""  # the polls of ./metrics passed the gateway's auth with the cookie
            assert int(text("requests-total")) >= 2 and text("kv-usage").endswith("%")
            assert text("ttft-p50").endswith("ms")
            # the gateway's own series: requests per rank and decisions by reason (pinned above)
            assert "rank 0: " in text("route-ranks") and "rank 1: " in text("route-ranks")
            assert "pinned: " in text("route-reasons")
        finally:
            browser.close()


MALFORMED = [  # (method, path, body, status): what the gateway answers itself, and what it passes through
    ("POST", "/v1/completions", b"", 400),
    ("POST", "/v1/chat/completions", b'{"messages": [', 400),
    ("POST", "/v1/completions", b'["hi"]', 400),
    ("POST", "/v1/completions", b'{"prompt": "\xff\xfe"}', 400),
    ("POST", "/v1/completions", b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}", 400),
    ("POST", "/v1/completions", b'{"prompt": "\\ud800"}', 400),
    ("POST", "/v1/completions", b'{"prompt": "hi", "stop": ' + b"[" * 100 + b"]" * 100 + b"}", 400),
    ("POST", "/v1/completions", b'{"prompt": "hi", "max_tokens": NaN}', 400),  # the rank refuses it
    ("POST", "/v1/completions", b'{"prompt": "hi", "max_tokens": 100000}', 400),
    ("POST", "/v1/chat/completions", b'{"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}', 404),
    ("GET", "/v1/completions", None, 405),
    ("GET", "/v1/nothing", None, 404),
    ("GET", "/v1/models/gpt-9", None, 404),
]


@pytest.mark.parametrize("method, path, body, status", MALFORMED)
def test_malformed_requests_through_the_gateway_get_json_4xx(
    http: httpx.Client, method: str, path: str, body: bytes | None, status: int
) -> None:
    headers = {**auth(ALICE), "Content-Type": "application/json"}
    resp = http.request(method, path, content=body, headers=headers)
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    assert set(resp.json()["error"]) == {"message", "type", "param", "code"}


def test_huge_header_at_the_gateway_gets_431(http: httpx.Client) -> None:
    for size in (40_000, 200 * 1024):  # the app's limit, then the HTTP parser's
        resp = http.get("/v1/models", headers={**auth(ALICE), "X-Big": "a" * size})
        assert resp.status_code == 431 and resp.json()["error"]["code"] == "headers_too_large", resp.text


def _wait_indexed(gw: GatewayThread, rank: int, path: str, body: dict[str, Any], tenant: str) -> None:
    """Until the gateway's index of `rank` holds the pages of this prompt (the rank's KV events are
    asynchronous; an agent's next turn comes after its tool ran)."""
    hasher = gw.gateway.hasher
    assert hasher is not None
    prompt = hasher.prompt(path, body, tenant)
    assert prompt is not None and prompt.hashes
    assert wait_for(lambda: gw.gateway.pool.workers[rank].index.match_pages(prompt.hashes) > 0, 60), "never indexed"


def test_sessions_keep_their_rank_and_their_hits_with_keys_on(gateway: GatewayThread, http: httpx.Client) -> None:
    """Three agents (two tenants) over cache_aware: every turn of a session lands on the rank that
    holds its earlier turns, and finds them there. The gateway hashes prompts with the key's tenant
    as the ranks do; hashed without it, nothing matched and the policy fell back to load."""
    sessions = {name: (key, tenant, [{"role": "system", "content": f"{uuid.uuid4()} You are agent {name}. " + PROMPT}])
                for name, key, tenant in (("a", ALICE, "alice"), ("b", BOB, "bob"), ("c", ALICE, "alice"))}
    ranks: dict[str, list[int]] = {name: [] for name in sessions}
    cached: dict[str, list[int]] = {name: [] for name in sessions}
    for turn in range(3):
        for name, (key, tenant, messages) in sessions.items():
            messages.append({"role": "user", "content": f"step {turn} of the task"})
            body = {"messages": messages, "max_tokens": 4, "temperature": 0}
            resp = http.post("/v1/chat/completions", json=body, headers={**auth(key), "Cache-Control": "no-cache"})
            assert resp.status_code == 200, resp.text
            ranks[name].append(int(resp.headers["x-kvstrata-rank"]))
            cached[name].append(resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
            messages.append({"role": "assistant", "content": resp.json()["choices"][0]["message"]["content"]})
            _wait_indexed(gateway, ranks[name][-1], "/v1/chat/completions", body, tenant)
    assert all(len(set(r)) == 1 for r in ranks.values()), ranks
    assert all(c[0] == 0 and min(c[1:]) >= 96 for c in cached.values()), cached


def test_responses_through_the_gateway_chain_on_their_rank_and_belong_to_their_tenant(http: httpx.Client) -> None:
    first = http.post("/v1/responses", headers=auth(ALICE),
                      json={"input": f"{uuid.uuid4()} {PROMPT}", "max_output_tokens": 4, "temperature": 0})
    assert first.status_code == 200, first.text
    rid, rank = first.json()["id"], first.headers["x-kvstrata-rank"]
    for _ in range(2):  # chained turns go where the conversation is stored, and hit its pages
        nxt = http.post("/v1/responses", headers=auth(ALICE),
                        json={"input": "go on", "previous_response_id": rid, "max_output_tokens": 4, "temperature": 0})
        assert nxt.status_code == 200, nxt.text
        assert nxt.headers["x-kvstrata-rank"] == rank
        assert nxt.json()["usage"]["input_tokens_details"]["cached_tokens"] >= 96
        rid = nxt.json()["id"]
    unknown = "resp_" + "0" * (len(rid) - 5)
    theirs, nobodys = (http.post("/v1/responses", headers=auth(BOB), json={"input": "x", "previous_response_id": r})
                       for r in (rid, unknown))
    assert theirs.status_code == nobodys.status_code == 400
    assert theirs.json()["error"]["message"].replace(rid, "ID") == nobodys.json()["error"]["message"].replace(unknown, "ID")
    assert {k: v for k, v in theirs.json()["error"].items() if k != "message"} == \
        {k: v for k, v in nobodys.json()["error"].items() if k != "message"}

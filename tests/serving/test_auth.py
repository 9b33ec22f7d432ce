"""API keys, tenant isolation of both caches, body size/depth limits, and prompts kept out of logs."""
from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from kvstrata.cli import build_parser
from kvstrata.config_flags import from_namespace
from kvstrata.config_server import ServerConfig
from kvstrata.engine.async_engine import AsyncEngine
from kvstrata.serving.auth import COOKIE, ApiKeys, read_key_file, tenant_extra_key
from kvstrata.serving.body_scan import json_depth
from serving_support import assert_error, make_state, serve

ALICE, BOB = "sk-alice-123", "sk-bob-456"


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("keys") / "keys.txt"
    path.write_text(f"# key tenant\n{ALICE} alice\n\n{BOB} bob  # comment\n")
    return str(path)


@pytest.fixture(scope="module")
def http(engine: AsyncEngine, key_file: str) -> Iterator[httpx.Client]:
    cfg = ServerConfig(port=0, api_key_file=key_file, response_cache_size=64, max_request_body_bytes=64 * 1024)
    with serve(make_state(engine, cfg)) as srv, httpx.Client(base_url=srv.base_url, timeout=30) as client:
        yield client


def test_keys_from_flags_file_and_environment(key_file: str) -> None:
    ns = build_parser().parse_args(["serve", "--api-key", "k1", "--api-key", "k2", "--api-key-file", key_file])
    cfg = from_namespace(ServerConfig, ns)
    assert cfg.api_key == ("k1", "k2")
    keys = ApiKeys.from_config(cfg, environ={"KVSTRATA_API_KEY": "k3"})
    assert keys.tenant_of(ALICE) == "alice" and keys.tenant_of(BOB) == "bob"
    assert {keys.tenant_of(k) for k in ("k1", "k2", "k3")} == {keys.tenants[k] for k in ("k1", "k2", "k3")}
    assert len({keys.tenant_of(k) for k in ("k1", "k2", "k3")}) == 3  # a bare key is its own tenant
    assert all("k1" not in t for t in keys.tenants.values())  # and the tenant name does not spell it
    assert keys.tenant_of("nope") is None and keys.tenant_of("") is None
    assert not ApiKeys.from_config(ServerConfig(), environ={}).enabled
    assert from_namespace(ServerConfig, build_parser().parse_args(["serve"])).api_key == ()


def test_bad_key_file_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("a b c\n")
    with pytest.raises(ValueError, match="line 1"):
        read_key_file(str(bad))
    with pytest.raises(ValueError, match="cannot read"):
        read_key_file(str(tmp_path / "missing"))


def test_tenant_and_salt_never_collide() -> None:
    assert tenant_extra_key(None, "s") == "s" and tenant_extra_key(None, None) is None
    assert tenant_extra_key("a", None) != tenant_extra_key("b", None)
    assert tenant_extra_key("a", "b\x00c") != tenant_extra_key("a\x00b", "c")
    assert tenant_extra_key("a", None) != "a"  # a tenant is never a bare cache_salt of an open server


BAD_AUTH = [{}, auth("sk-wrong"), {"Authorization": ALICE}, {"Authorization": "Basic " + ALICE}]


@pytest.mark.parametrize("headers", BAD_AUTH)
def test_missing_or_wrong_key_gets_401(http: httpx.Client, headers: dict[str, str]) -> None:
    for method, path in [("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
                         ("GET", "/metrics"), ("POST", "/flush_cache"), ("GET", "/response_cache"),
                         ("GET", "/openapi.json")]:
        resp = http.request(method, path, headers=headers, json={"prompt": "x"} if method == "POST" else None)
        assert_error(resp, 401, code="invalid_api_key")
        assert resp.headers["www-authenticate"] == "Bearer"


def test_health_is_open_and_keys_open_the_rest(http: httpx.Client) -> None:
    assert http.get("/health").status_code == 200
    assert http.get("/metrics", headers=auth(ALICE)).status_code == 200
    assert http.get("/v1/models", headers=auth(BOB)).status_code == 200


def test_metrics_public_opens_operational_routes_only(engine: AsyncEngine) -> None:
    cfg = ServerConfig(port=0, api_key=("k",), metrics_public=True)
    with serve(make_state(engine, cfg)) as srv, httpx.Client(base_url=srv.base_url) as client:
        assert client.get("/metrics").status_code == 200
        assert client.get("/response_cache").status_code == 200
        assert_error(client.get("/v1/models"), 401)
        assert_error(client.post("/v1/completions", json={"prompt": "x"}), 401)


def _complete(http: httpx.Client, key: str, prompt: str, **extra: Any) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": 2, "temperature": 0, **extra}
    resp = http.post("/v1/completions", json=body, headers={**auth(key), "Cache-Control": "no-cache"})
    assert resp.status_code == 200, resp.text
    return resp


def _cached(resp: httpx.Response) -> int:
    return int(resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def test_tenants_share_no_prefix_pages(http: httpx.Client) -> None:
    prompt = f"{uuid.uuid4()} " + "the quick brown fox jumps over the lazy dog " * 12  # ~110 tokens, 6+ pages
    assert _cached(_complete(http, ALICE, prompt)) == 0
    assert _cached(_complete(http, ALICE, prompt)) >= 96  # alice hits her own pages
    assert _cached(_complete(http, BOB, prompt)) == 0  # bob never sees them, nor their timing
    assert _cached(_complete(http, BOB, prompt)) >= 96
    salted = _complete(http, ALICE, prompt, cache_salt="s1")
    assert _cached(salted) == 0  # a salt splits a tenant's cache further
    assert _cached(_complete(http, BOB, prompt, cache_salt="s1")) == 0  # and a shared salt joins no tenants


def test_tenants_share_no_cached_response(http: httpx.Client) -> None:
    body = {"prompt": f"{uuid.uuid4()} hello", "max_tokens": 3, "temperature": 0}

    def status(key: str) -> str:
        resp = http.post("/v1/completions", json=body, headers=auth(key))
        assert resp.status_code == 200, resp.text
        return resp.headers["x-kvstrata-cache"]

    assert [status(ALICE), status(ALICE), status(BOB), status(BOB)] == ["miss", "hit", "miss", "hit"]


def test_fixed_keys_hold_for_each_tenant(engine: AsyncEngine, key_file: str, tmp_path: Path) -> None:
    """--response-cache-fixed-keys with keys on: each tenant's copy of a fixed request is never
    evicted (the keys were once built without a tenant, so no authenticated request hit them)."""
    fixed = {"prompt": "a fixed question", "max_tokens": 3, "temperature": 0}
    path = tmp_path / "fixed.jsonl"
    path.write_text(json.dumps(fixed) + "\n")
    cfg = ServerConfig(port=0, api_key_file=key_file, response_cache_size=1, response_cache_fixed_keys=str(path))
    with serve(make_state(engine, cfg)) as srv, httpx.Client(base_url=srv.base_url, timeout=30) as http:

        def status(key: str, body: dict[str, Any]) -> str:
            resp = http.post("/v1/completions", json=body, headers=auth(key))
            assert resp.status_code == 200, resp.text
            return resp.headers["x-kvstrata-cache"]

        assert [status(ALICE, fixed), status(BOB, fixed)] == ["miss", "miss"]  # tenants share no result
        for i in range(3):  # more ordinary keys than the cache holds: they evict one another
            assert status(ALICE, {**fixed, "prompt": f"other {i}"}) == "miss"
        assert [status(ALICE, fixed), status(BOB, fixed)] == ["hit", "hit"]


def test_body_over_the_limit_gets_413(http: httpx.Client) -> None:
    big = {"prompt": "x " * 40_000}
    assert_error(http.post("/v1/completions", json=big, headers=auth(ALICE)), 413, code="request_too_large")

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it streams in
        yield b'{"prompt": "'
        for _ in range(100):
            yield b"x" * 1024
        yield b'"}'

    resp = http.post("/v1/completions", content=chunks(), headers={**auth(ALICE), "Content-Type": "application/json"})
    assert_error(resp, 413, code="request_too_large")


def test_huge_headers_get_431(http: httpx.Client) -> None:
    resp = http.get("/v1/models", headers={**auth(ALICE), "X-Big": "a" * 40_000})
    assert_error(resp, 431, code="headers_too_large")


def test_deep_json_gets_400(http: httpx.Client) -> None:
    deep = '{"prompt": "x", "stop": ' + "[" * 500 + "]" * 500 + "}"
    resp = http.post("/v1/completions", content=deep, headers={**auth(ALICE), "Content-Type": "application/json"})
    assert_error(resp, 400, code="json_too_deep")
    assert json_depth(b'{"a": "[[[[{{{{", "b": [1, {"c": [2]}]}') == 4  # brackets in strings do not count
    assert json_depth(b'{"a": "\\"[[["}') == 1


def test_prompt_text_stays_out_of_the_log(http: httpx.Client, caplog: pytest.LogCaptureFixture) -> None:
    secret = f"secret-{uuid.uuid4().hex}"
    with caplog.at_level(logging.DEBUG):
        _complete(http, ALICE, f"my password is {secret}")
        http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": secret}], "max_tokens": 1},
                  headers=auth(ALICE))
        http.post("/v1/completions", json={"prompt": secret, "max_tokens": -1}, headers=auth(ALICE))  # a 400
    assert caplog.records and not [r for r in caplog.records if secret in r.getMessage()]


def test_dashboard_api_key_in_the_url_sets_a_cookie_for_dashboard_and_metrics_only(http: httpx.Client) -> None:
    with httpx.Client(base_url=str(http.base_url), timeout=30) as browser:
        assert_error(browser.get("/dashboard", params={"api_key": "sk-wrong"}), 401, code="invalid_api_key")
        assert_error(browser.get("/metrics", params={"api_key": ALICE}), 401)  # the URL key is for /dashboard only
        assert not browser.cookies
        page = browser.get("/dashboard", params={"api_key": ALICE})
        assert page.status_code == 200 and "<canvas" in page.text
        cookie = page.headers["set-cookie"]
        assert cookie.startswith(f"{COOKIE}=") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
        assert ALICE not in cookie
        assert browser.get("/metrics").status_code == 200  # the page's polls carry the cookie
        assert browser.get("/dashboard").status_code == 200
        for method, path in [("GET", "/v1/models"), ("GET", "/response_cache"), ("POST", "/flush_cache")]:
            assert_error(browser.request(method, path), 401, code="invalid_api_key")
        resp = browser.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert_error(resp, 401)
    with httpx.Client(base_url=str(http.base_url), cookies={COOKIE: "f" * 64}) as forged:
        assert_error(forged.get("/metrics"), 401)

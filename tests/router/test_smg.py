"""kvstrata behind the real SGLang Model Gateway (`smg` from sglang-router, the dev extra), with the
real openai client: two `kvstrata serve` processes behind `smg launch --policy cache_aware`, and one
`kvstrata serve --dp-size 2` behind `smg --dp-aware`, which must learn the rank count from
/server_info and pin each request to a rank (our gateway counts those as "pinned")."""
from __future__ import annotations

import platform
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvstrata.process_tree import pdeathsig_preexec
from kvstrata.serving.ports import free_port
from proc_support import KvstrataProcess, alive, descendants, wait_for

MODEL = "tiny"
pytestmark = pytest.mark.skipif(
    not (sys.platform == "linux" and platform.machine() == "x86_64") and shutil.which("smg") is None
    and not Path(sys.executable).with_name("smg").exists(),
    reason="sglang-router ships smg for x86_64 Linux only (the dev extra installs it there)")
LONG = " ".join(f"tool{i} returns the weather for city{i} as JSON." for i in range(40))


def _smg_binary() -> str:
    found = shutil.which("smg") or str(Path(sys.executable).with_name("smg"))
    assert Path(found).exists(), "smg is missing: pip install -e '.[dev]' installs sglang-router"
    return found


class Smg:
    def __init__(self, workers: list[str], log: Path, *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = log.open("w")
        self.log = log
        self.proc = subprocess.Popen(
            [_smg_binary(), "launch", "--host", "127.0.0.1", "--port", str(self.port), "--worker-urls", *workers,
             "--policy", "cache_aware", "--log-level", "info", "--disable-retries",
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), *extra],
            stdout=self._log, stderr=subprocess.STDOUT, preexec_fn=pdeathsig_preexec,
        )

    def wait_models(self, count: int) -> dict:
        def listed() -> dict | None:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                body = httpx.get(self.url + "/workers", timeout=5).json()
            except (httpx.HTTPError, ValueError):
                return None
            workers = body.get("workers", [])
            return body if len(workers) == count and all(w.get("is_healthy") for w in workers) else None

        return wait_for(listed, f"smg lists {count} healthy workers")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _serve(model: Path, port: int, log: Path, *extra: str) -> KvstrataProcess:
    return KvstrataProcess(["serve", "--model", str(model), "--served-model-name", MODEL, "--dtype", "float32",
                            "--port", str(port), "--num-threads", "1", "--max-total-tokens", "4096",
                            "--max-model-len", "2048", *extra], log)


@pytest.fixture(scope="module")
def backends(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Two single servers and one `--dp-size 2` launcher (TokenSpeed's spelling), started at once."""
    logs = tmp_path_factory.mktemp("smg-backends")
    ports = [free_port() for _ in range(3)]
    procs = [
        _serve(tiny_model_dir, ports[0], logs / "a.log"),
        _serve(tiny_model_dir, ports[1], logs / "b.log"),
        _serve(tiny_model_dir, ports[2], logs / "dp.log", "--dp-size", "2", "--policy", "cache_aware", "--dp-aware",
               "--health-check-interval", "0.2"),
    ]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        for proc, url, ranks in zip(procs, urls, (0, 0, 2)):
            proc.wait_healthy(url, ranks=ranks)
        yield {"a": urls[0], "b": urls[1], "dp": urls[2]}
    finally:
        trees = [descendants(p.proc.pid) for p in procs]
        for proc in procs:
            proc.proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.proc.wait(timeout=120)
            proc.close()
        wait_for(lambda: not [pid for tree in trees for pid in tree if alive(pid)], "no process of theirs left")


@pytest.fixture(scope="module")
def smg(backends: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Smg]:
    gw = Smg([backends["a"], backends["b"]], tmp_path_factory.mktemp("smg") / "smg.log")
    try:
        gw.wait_models(2)
        yield gw
    finally:
        gw.close()


def test_worker_info_routes_name_the_model_and_a_loadable_tokenizer(backends: dict[str, str]) -> None:
    for path in ("/server_info", "/get_server_info"):
        info = httpx.get(backends["a"] + path).json()
        assert info["served_model_name"] == MODEL and info["dp_size"] == 1
        assert info["page_size"] == 16 and info["dtype"] == "float32" and len(info["kv_namespace"]) == 64
        assert (Path(info["tokenizer_path"]) / "tokenizer.json").is_file()
    for path in ("/model_info", "/get_model_info"):
        info = httpx.get(backends["a"] + path).json()
        assert info["is_generation"] is True and info["architectures"] == ["LlamaForCausalLM"]
    assert httpx.get(backends["dp"] + "/server_info").json()["dp_size"] == 2  # the gateway speaks for 2 ranks


def test_smg_lists_our_model_and_loads_its_tokenizer(smg: Smg, backends: dict[str, str]) -> None:
    workers = smg.wait_models(2)["workers"]
    assert {w["model_id"] for w in workers} == {MODEL}
    assert {w["url"] for w in workers} == {backends["a"], backends["b"]}
    models = openai.OpenAI(base_url=smg.url + "/v1", api_key="unused").models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert httpx.get(smg.url + "/health").status_code == 200
    assert httpx.get(smg.url + "/readiness").status_code == 200
    # smg registers the tokenizer it fetched from a worker on its own task, which may log after the
    # workers are listed (a loaded machine lost that race once): poll its log
    wait_for(lambda: f"Successfully registered tokenizer '{MODEL}'" in smg.log.read_text(), "smg registers the tokenizer", 60.0)


def test_chat_and_completions_through_smg_streamed_and_not_with_cached_tokens(smg: Smg) -> None:
    client = openai.OpenAI(base_url=smg.url + "/v1", api_key="unused", max_retries=0)
    messages = [{"role": "system", "content": LONG}, {"role": "user", "content": "Weather in city3?"}]
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)
    again = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)
    assert first.choices[0].message.content == again.choices[0].message.content
    assert first.usage.prompt_tokens > 300
    assert again.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 16  # same worker, cached
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == first.choices[0].message.content
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 16
    done = client.completions.create(model=MODEL, prompt=LONG, max_tokens=4, temperature=0)
    assert done.choices[0].finish_reason == "length" and done.usage.prompt_tokens > 300
    parts = list(client.completions.create(model=MODEL, prompt=LONG, max_tokens=4, temperature=0, stream=True))
    assert "".join(p.choices[0].text for p in parts if p.choices) == done.choices[0].text


def _pinned_per_rank(url: str) -> dict[str, float]:
    counts: dict[str, float] = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in fam.samples:
            if s.name == "kvstrata:router_requests_total" and s.labels.get("policy") == "pinned":
                counts[s.labels["rank"]] = s.value
    return counts


def test_smg_dp_aware_learns_two_ranks_and_pins_each_request(
    backends: dict[str, str], tmp_path: Path
) -> None:
    # round_robin so the split is known; smg's cache_aware sends these chats, which share the
    # template's default system prompt, all to one rank
    gw = Smg([backends["dp"]], tmp_path / "smg-dp.log", "--dp-aware", "--policy", "round_robin")
    try:
        workers = gw.wait_models(2)["workers"]
        assert sorted(w["url"] for w in workers) == [backends["dp"] + "@0", backends["dp"] + "@1"]
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
        before = _pinned_per_rank(backends["dp"])
        for i in range(8):
            prompt = f"session {i}: " + LONG[i * 37:]
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=2)
        after = _pinned_per_rank(backends["dp"])
        pinned = {r: after.get(r, 0) - before.get(r, 0) for r in ("0", "1")}
        assert pinned == {"0": 4, "1": 4}, pinned  # every request came pinned to a rank by smg, in turn
    finally:
        gw.close()


def test_a_single_server_refuses_a_rank_it_does_not_have(backends: dict[str, str]) -> None:
    resp = httpx.post(backends["a"] + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "data_parallel_rank": 99})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "data_parallel_rank"
    resp = httpx.post(backends["dp"] + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "data_parallel_rank": 2})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "data_parallel_rank"

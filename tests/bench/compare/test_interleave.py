"""`bench compare --interleave` (kvstrata/bench/compare/interleave.py): every engine up at once, the probe's
measurements taken in turns with the order rotated each round, figures kept by round, the ratios under
the table; flags it cannot run with exit 2 before anything starts."""
from __future__ import annotations

import asyncio
import json
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from _fake_openai_peer import FakePeer, serve_fake_peer
from kvstrata.bench.compare.engines import EngineSpec
from kvstrata.bench.compare.interleave import interleaved_probe, ratio_lines
from kvstrata.bench.throughput.probe import ProbeConfig
from kvstrata.cli import main

FAKE = str(Path(__file__).resolve().parents[1] / "_fake_engine_proc.py")


class _Arrivals(list):  # type: ignore[type-arg]
    """A peer's request list that also writes (peer, kind) into one log shared by the peers, in arrival order."""

    def __init__(self, name: str, log: list[tuple[str, str]]) -> None:
        super().__init__()
        self.name, self.log = name, log

    def append(self, body: dict[str, Any]) -> None:
        super().append(body)
        kind = "prefill" if "Summarize" in body["messages"][-1]["content"] else f"decode{body['max_tokens']}"
        self.log.append((self.name, kind))


def test_rounds_take_turns_in_a_rotating_order_and_send_each_engine_the_same_texts() -> None:
    log: list[tuple[str, str]] = []
    config = ProbeConfig(prefill_tokens=64, decode_tokens=8, decode_batch=2, repeats=2)
    with serve_fake_peer() as a, serve_fake_peer() as b:
        peers: dict[str, FakePeer] = {"a": a, "b": b}
        for name, peer in peers.items():
            peer.requests = _Arrivals(name, log)
        reports = asyncio.run(interleaved_probe({n: p.url for n, p in peers.items()}, "ok", config))
    warm = [("a", "decode1"), ("b", "decode1")]

    def one_round(first: str, second: str) -> list[tuple[str, str]]:
        return [(first, "prefill"), (second, "prefill"), (first, "decode8"), (second, "decode8"),
                (first, "decode8"), (first, "decode8"), (second, "decode8"), (second, "decode8")]

    assert log == warm + one_round("a", "b") + one_round("b", "a")
    for name, report in reports.items():
        assert report["errors"] == 0 and len(report["prefill"]) == 2
        assert [sorted(r) for r in report["rounds"]] == [["1", "2", "prefill"]] * 2
        assert all(v is not None and v > 0 for r in report["rounds"] for v in r.values())
        for batch in ("1", "2"):
            rates = [r[batch] for r in report["rounds"]]
            assert report["decode_tokens_per_s"][batch] == pytest.approx(sum(rates) / 2)
            assert len(report["decode"][batch]["runs"]) == 2
    # the same texts to both engines, each led by its own nonce ("Run <ns>-<n>."; a batch's streams may
    # arrive in either order)
    texts = {n: sorted(" ".join(m["content"].split()[2:]) for body in p.requests for m in body["messages"])
             for n, p in peers.items()}
    assert texts["a"] == texts["b"] and len(set(texts["a"])) > 3


def test_ratio_lines_give_every_round() -> None:
    rounds = {"ours": [{"prefill": 30.0, "1": 12.0}, {"prefill": 33.0, "1": 9.0}],
              "peer": [{"prefill": 25.0, "1": 8.0}, {"prefill": 24.0, "1": None}]}
    results = {n: {"throughput": {"rounds": r}} for n, r in rounds.items()} | {"gone": {"error": "missing"}}
    assert ratio_lines(results) == ["ours / peer by round: cold prefill 1.20x, 1.38x; decode b1 1.50x, n/a"]
    assert ratio_lines({"ours": results["ours"]}) == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_compare_interleave_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(Path(FAKE).parent))
    fake = {name: EngineSpec(name, lambda port, gguf: [sys.executable, FAKE, str(port)], "", "", 30.0)
            for name in ("kvstrata", "peer")}
    fake["absent"] = EngineSpec("absent", lambda port, gguf: ["true"], "does/not/exist", "install it", 30.0)
    monkeypatch.setattr("kvstrata.bench.compare.command.ENGINES", fake)
    monkeypatch.setattr("kvstrata.bench.compare.interleave.ENGINES", fake)
    port = _free_port()
    rc = main(["bench", "compare", "--workload", "throughput", "--interleave", "--engines", "kvstrata,absent,peer",
               "--model", "ok", "--out-dir", str(tmp_path), "--port", str(port), "--no-plots", "--prefill-tokens", "64",
               "--decode-tokens", "8", "--decode-batch", "2", "--probe-repeats", "2"])
    assert rc == 1  # one engine could not start; the other two ran
    [result] = tmp_path.glob("throughput-*.json")
    summary = json.loads(result.read_text())
    assert summary["interleaved"] is True and "does/not/exist" in summary["engines"]["absent"]["error"]
    ours, peer = summary["engines"]["kvstrata"], summary["engines"]["peer"]
    assert ours["meta"]["url"].endswith(f":{port}") and peer["meta"]["url"].endswith(f":{port + 2}")
    for report in (ours, peer):
        assert report["errors"] == 0 and len(report["throughput"]["rounds"]) == 2
        assert report["meta"]["startup_s"] > 0 and report["meta"]["rss_mb"] > 10
    table = result.with_suffix(".md").read_text()
    assert table.count("| kvstrata |") == table.count("| peer |") == 1 and "not run: absent" in table
    assert "\nkvstrata / peer by round: cold prefill " in table and "; decode b2 " in table


@pytest.mark.parametrize(("argv", "message"), [
    (["--workload", "agentic"], "--workload throughput"),
    (["--workload", "throughput", "--no-throughput"], "--workload throughput"),
    (["--workload", "throughput", "--engines", "kvstrata"], "two or more"),
    (["--workload", "throughput", "--engines", "kvstrata,kvstrata"], "two or more"),
    (["--workload", "throughput", "--port", "65535"], "--port 65535"),
])
def test_interleave_flags_it_cannot_run_exit_2(argv: list[str], message: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "compare", "--interleave", "--out-dir", str(tmp_path), *argv]) == 2
    assert message in capsys.readouterr().err and not list(tmp_path.iterdir())

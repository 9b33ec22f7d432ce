"""`kvstrata bench compare`: each engine started in turn, the same workload, one JSON/table/plot set."""
from __future__ import annotations

import json
import socket
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kvstrata.bench.compare import command, engines
from kvstrata.bench.compare.engines import EngineSpec
from kvstrata.bench.compare.table import markdown_table, throughput_columns
from kvstrata.bench.compare.workloads import COMPARE_WORKLOADS
from kvstrata.cli import main
from kvstrata.model.dtype_plan import peer_dtype

FAKE = str(Path(__file__).resolve().parents[1] / "_fake_engine_proc.py")  # the test doubles live in tests/bench/


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_compare_runs_each_engine_and_writes_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tokenizer_path: str
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(Path(FAKE).parent))
    monkeypatch.setattr(engines, "ENGINES", {
        "fake": EngineSpec("fake", lambda port, gguf: [sys.executable, FAKE, str(port)], "", "", 30.0),
        "absent": EngineSpec("absent", lambda port, gguf: ["true"], "does/not/exist", "install it", 30.0),
    })
    # command.ENGINES is the module's own binding: patched (and restored) on the imported module, never
    # imported for the first time while engines.ENGINES is the fake (its restore would keep the fake)
    monkeypatch.setattr(command, "ENGINES", engines.ENGINES)
    rc = main(["bench", "compare", "--engines", "fake,absent", "--model", "ok", "--sessions", "2", "--turns", "2",
               "--system-tokens", "800", "--turn-tokens", "20", "--max-tokens", "4", "--out-dir", str(tmp_path),
               "--port", str(_free_port()), "--tokenizer", tokenizer_path, "--prefill-tokens", "64",
               "--decode-tokens", "8", "--probe-repeats", "1"])
    assert rc == 1  # one engine could not run
    [result] = tmp_path.glob("agentic-*.json")
    summary = json.loads(result.read_text())
    fake = summary["engines"]["fake"]
    assert fake["requests"] == 4 and fake["errors"] == 0 and fake["meta"]["engine"] == "fake"
    assert "does/not/exist" in summary["engines"]["absent"]["error"]
    table = result.with_suffix(".md").read_text()
    assert "| fake |" in table and "| absent | not run" in table
    assert summary["machine"]["cpu_model"] and "machine: " in table  # which CPU the figures come from
    assert result.with_suffix(".png").stat().st_size > 10_000
    assert fake["throughput"]["errors"] == 0 and "| cold prefill tokens/s |" in table
    assert (tmp_path / result.name.replace(".json", "-throughput.png")).stat().st_size > 10_000
    assert (tmp_path / "logs").is_dir()


def _fake_engines(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake peer process under the name "kvstrata" (so it gets kvstrata's workload flags) and "peer"."""
    monkeypatch.setenv("PYTHONPATH", str(Path(FAKE).parent))
    fake = {name: EngineSpec(name, lambda port, gguf: [sys.executable, FAKE, str(port)], "", "", 30.0)
            for name in ("kvstrata", "peer")}
    monkeypatch.setattr("kvstrata.bench.compare.command.ENGINES", fake)


def _fake_log(tmp_path: Path, engine: str) -> list[dict[str, Any]]:
    """What the fake engine process printed (`FAKE {json}` lines in the log `compare` kept for it)."""
    [log] = tmp_path.glob(f"logs/*-{engine}.log")
    return [json.loads(line[5:]) for line in log.read_text().splitlines() if line.startswith("FAKE ")]


def _compare(tmp_path: Path, workload: str, *argv: str) -> tuple[int, dict[str, Any], str]:
    rc = main(["bench", "compare", "--workload", workload, "--engines", "kvstrata,peer", "--model", "ok",
               "--out-dir", str(tmp_path), "--port", str(_free_port()), "--no-plots", *argv])
    [result] = tmp_path.glob(f"{workload}-*.json")
    return rc, json.loads(result.read_text()), result.with_suffix(".md").read_text()


def test_registry_has_every_workload_with_its_columns() -> None:
    assert list(COMPARE_WORKLOADS) == ["agentic", "multiround", "repeat", "throughput", "edit", "trace"]
    headers = {name: [c.header for c in w.columns] for name, w in COMPARE_WORKLOADS.items()}
    assert "hit efficiency" in headers["agentic"] and "TTFT later turns p50 / p90" in headers["agentic"]
    assert {"hit efficiency", "TTFT p50 by round (s)", "TTFT later rounds p50 / p99"} <= set(headers["multiround"])
    assert {"latency mean / p50 / p99 ms", "response-cache hits"} <= set(headers["repeat"])
    assert headers["throughput"] == [] and not COMPARE_WORKLOADS["throughput"].probe_after
    assert COMPARE_WORKLOADS["repeat"].serve_args == {"kvstrata": ("--response-cache-size", "1024")}
    assert {"output tokens/s", "TPOT p50 / p99 ms", "accepted per verify step"} <= set(headers["edit"])
    assert [c.header for c in throughput_columns(8)] == [
        "cold prefill tokens/s", "decode tokens/s, batch 1", "decode tokens/s, batch 8", "probe errors"]


def test_every_workload_leaves_the_dtype_to_each_engines_default_plan() -> None:
    """One rule for peers' settings: no workload passes --dtype; kvstrata runs `--dtype auto` and vLLM
    the dtype engines.py gives it (peer_dtype(), the same for every workload)."""
    for name, workload in COMPARE_WORKLOADS.items():
        for engine, flags in workload.serve_args.items():
            assert not any(f == "--dtype" or f.startswith("--dtype=") for f in flags), (name, engine)
    assert "--dtype" not in engines._kvstrata(8300, "m.gguf")
    vllm = engines._vllm(8300, "m.gguf")
    assert vllm[vllm.index("--dtype") + 1] == peer_dtype()


def test_table_rows_carry_the_probe_figures_and_a_not_run_row_has_every_cell() -> None:
    probe = {"prefill_tokens_per_s": 891.4, "decode_tokens_per_s": {"1": 32.04, "8": None}, "errors": 0}
    results = {"a": {"errors": 0, "throughput": probe}, "b": {"error": "missing"}}
    table = markdown_table(results, throughput_columns(8)).splitlines()
    assert table[0] == ("| engine | cold prefill tokens/s | decode tokens/s, batch 1 | decode tokens/s, batch 8 "
                        "| probe errors |")
    assert table[2] == "| a | 891 | 32.0 | n/a | 0 |"
    assert table[3].count("|") == table[0].count("|") and "not run: missing" in table[3]


@pytest.mark.parametrize(("argv", "message"), [
    (["--workload", "multiround", "--num-rounds", "20"], "--num-rounds"),
    (["--workload", "agentic", "--turns", "1"], "--turns"),
    (["--workload", "repeat", "--repeat-ratio", "2"], "--repeat-ratio"),
    (["--workload", "repeat", "--decode-batch", "0"], "--decode-batch"),
    (["--engines", "kvstrata,nope"], "nope"),
])
def test_bad_flags_exit_2_before_any_engine_starts(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "compare", "--out-dir", str(tmp_path), *argv]) == 2
    assert message in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_compare_multiround_with_the_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tokenizer_path: str
) -> None:
    _fake_engines(monkeypatch)
    rc, summary, table = _compare(tmp_path, "multiround", "--num-users", "2", "--num-rounds", "2", "--system-tokens",
                                  "100", "--history-tokens", "100", "--answer-tokens", "4", "--prefill-tokens", "64",
                                  "--decode-tokens", "8", "--decode-batch", "2", "--probe-repeats", "1",
                                  "--tokenizer", tokenizer_path)
    assert rc == 0
    for name in ("kvstrata", "peer"):
        report = summary["engines"][name]
        assert report["requests"] == 4 and report["errors"] == 0 and report["meta"]["engine"] == name
        assert [r["turn"] for r in report["per_round"]] == [0, 1]
        assert report["throughput"]["errors"] == 0 and set(report["throughput"]["decode_tokens_per_s"]) == {"1", "2"}
    header = table.splitlines()[2]
    assert "TTFT p50 by round (s)" in header and header.endswith("| decode tokens/s, batch 2 | probe errors | start to healthy | server RSS after the run / peak, MB |")
    assert table.count("| kvstrata |") == 1 and table.count("| peer |") == 1


def test_compare_repeat_turns_the_response_cache_on_for_kvstrata_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_engines(monkeypatch)
    rc, summary, table = _compare(tmp_path, "repeat", "--num-requests", "12", "--repeat-ratio", "1", "--hot-prompts",
                                  "1", "--concurrency", "1", "--max-tokens", "4", "--no-throughput",
                                  "--tokenizer", "/does/not/matter.gguf")
    assert rc == 0
    ours, peer = summary["engines"]["kvstrata"], summary["engines"]["peer"]
    ours_log, peer_log = _fake_log(tmp_path, "kvstrata"), _fake_log(tmp_path, "peer")
    # compare started kvstrata, and only kvstrata, with its response cache on, and says so
    assert ours_log[0] == {"flags": ["--response-cache-size", "1024"]} and peer_log[0] == {"flags": []}
    assert ours["meta"]["serve_args"] == ["--response-cache-size", "1024"] and peer["meta"]["serve_args"] == []
    # it sent each engine the same 12 requests, one hot prompt repeated ...
    for log in (ours_log, peer_log):
        assert [r["body"] for r in log[1:]] == [ours_log[1]["body"]] * 12
    # ... and reports exactly the x-kvstrata-cache headers each one answered, in the JSON and the table
    assert ours["cache_header"] == Counter(r["cache"] for r in ours_log[1:]) and "hit" in ours["cache_header"]
    assert peer["cache_header"] == Counter(r["cache"] for r in peer_log[1:]) == {"": 12}
    assert ours["all"]["requests"] == peer["all"]["requests"] == 12
    assert "throughput" not in ours and "cold prefill tokens/s" not in table
    rows = {line.split("|")[1].strip(): line for line in table.splitlines()[4:]}
    assert rows["kvstrata"].split("|")[6].strip() == str(ours["cache_header"]["hit"])
    assert rows["peer"].split("|")[6].strip() == "0"


def test_compare_throughput_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_engines(monkeypatch)
    rc, summary, table = _compare(tmp_path, "throughput", "--prefill-tokens", "64", "--decode-tokens", "8",
                                  "--probe-repeats", "1", "--tokenizer", "/does/not/matter.gguf")
    assert rc == 0
    assert all(r["throughput"]["prefill_tokens_per_s"] > 0 for r in summary["engines"].values())
    assert "(machine: " in table.splitlines()[0] and summary["machine"]["torch_version"]
    assert table.splitlines()[2] == ("| engine | cold prefill tokens/s | decode tokens/s, batch 1 | "
                                     "decode tokens/s, batch 8 | probe errors | start to healthy | "
                                     "server RSS after the run / peak, MB |")
    for name, report in summary["engines"].items():  # the fake server's own process, measured from /proc
        meta = report["meta"]
        assert meta["processes"] >= 1 and 10 < meta["rss_mb"] <= meta["peak_rss_mb"], meta
        row = next(line for line in table.splitlines() if line.startswith(f"| {name} |"))
        assert row.endswith(f"| {meta['startup_s']:.0f} s | {meta['rss_mb']:,.0f} / {meta['peak_rss_mb']:,.0f} |")


def test_context_gives_every_engine_that_many_positions() -> None:
    from kvstrata.bench.compare.workloads import context_args

    assert context_args("kvstrata", 0) == context_args("llamacpp", 0) == []
    assert context_args("kvstrata", 32768) == ["--max-model-len", "32768", "--max-total-tokens", "32768"]
    assert context_args("llamacpp", 32768) == ["-c", "32768", "-np", "1"]  # after the 8 slots: the last flag wins
    assert context_args("vllm", 32768) == ["--max-model-len", "32768"]

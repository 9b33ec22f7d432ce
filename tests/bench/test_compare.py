"""`kvstrata bench compare`: each engine started in turn, the same workload, one JSON/table/plot set."""
from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from kvstrata.bench import engines
from kvstrata.bench.engines import EngineSpec
from kvstrata.cli import main

FAKE = str(Path(__file__).with_name("_fake_engine_proc.py"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_compare_runs_each_engine_and_writes_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tokenizer_path: str
) -> None:
    pytest.importorskip("matplotlib", reason="pip install -e '.[bench]' for the compare plots")
    monkeypatch.setenv("PYTHONPATH", str(Path(FAKE).parent))
    monkeypatch.setattr(engines, "ENGINES", {
        "fake": EngineSpec("fake", lambda port, gguf: [sys.executable, FAKE, str(port)], "", "", 30.0),
        "absent": EngineSpec("absent", lambda port, gguf: ["true"], "does/not/exist", "install it", 30.0),
    })
    monkeypatch.setattr("kvstrata.bench.compare.ENGINES", engines.ENGINES)
    rc = main(["bench", "compare", "--engines", "fake,absent", "--model", "ok", "--sessions", "2", "--turns", "2",
               "--system-tokens", "800", "--turn-tokens", "20", "--max-tokens", "4", "--out-dir", str(tmp_path),
               "--port", str(_free_port()), "--tokenizer", tokenizer_path])
    assert rc == 1  # one engine could not run
    [result] = tmp_path.glob("agentic-*.json")
    summary = json.loads(result.read_text())
    fake = summary["engines"]["fake"]
    assert fake["requests"] == 4 and fake["errors"] == 0 and fake["meta"]["engine"] == "fake"
    assert "does/not/exist" in summary["engines"]["absent"]["error"]
    table = result.with_suffix(".md").read_text()
    assert "| fake |" in table and "| absent | not run" in table
    assert result.with_suffix(".png").stat().st_size > 10_000
    assert (tmp_path / "logs").is_dir()

"""`kvstrata bench agents` end to end: the real Claude Code CLI against kvstrata on a small synthetic GGUF
whose replies end (synth-model --ends-replies): every turn succeeds, later turns and a new session read
the cache, and after a restart over the file L3 a new session still does."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from kvstrata.bench.agents.command import add_agents_args, run_agents
from kvstrata.bench.synth.command import end_of_turn_id
from kvstrata.bench.synth.shapes import SHAPES
from kvstrata.bench.synth.writer import write_gguf

pytestmark = pytest.mark.slow


def test_claude_code_on_kvstrata_with_a_restart(tmp_path: Path, smollm2_path: Path) -> None:
    model = tmp_path / "tiny-qwen3-ends.gguf"
    write_gguf(model, SHAPES["tiny-qwen3"], lambda name: "Q8_0", smollm2_path, ends_replies=end_of_turn_id(smollm2_path))
    parser = argparse.ArgumentParser()
    add_agents_args(parser)
    args = parser.parse_args(["--client", "claude-code", "--engines", "kvstrata", "--model-file", str(model),
                              "--sessions", "2", "--turns", "2", "--out-dir", str(tmp_path / "out")])
    assert run_agents(args) == 0
    [report] = [json.loads(p.read_text()) for p in (tmp_path / "out").glob("agents-*.json")]
    turns = report["turns"]
    assert [(t["session"], t["turn"], t["after_restart"]) for t in turns] == \
        [(1, 1, False), (1, 2, False), (2, 1, False), (2, 2, False), (3, 1, True)]
    assert all(t["ok"] and t["ttft_s"] and t["prompt_tokens"] > 5000 for t in turns), turns
    assert turns[0]["cached_tokens"] == 0
    assert all(t["cached_tokens"] >= 0.9 * t["prompt_tokens"] for t in turns if t["turn"] == 2), turns
    assert turns[2]["cached_tokens"] >= 0.5 * turns[2]["prompt_tokens"]  # the CLI's system prompt and tools
    assert turns[4]["cached_tokens"] >= 0.5 * turns[4]["prompt_tokens"]  # the same, from L3 after the restart
    assert str(tmp_path) not in json.dumps(report)  # no machine path in a result
    [row] = report["summary"]
    assert row["errors"] == 0 and row["new_session_vs_cold"] is not None and row["after_restart_vs_cold"] is not None

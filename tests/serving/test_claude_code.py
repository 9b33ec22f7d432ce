"""The real Claude Code CLI (`make agent-deps` pins it in .agents/), headless, against a real `kvstrata serve`
on a tiny Qwen3-shaped model (agent_cli_support.py): two `claude -p` turns, the second with `--resume`,
both exit 0, and the second turn reads most of its prompt from the prefix cache."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest

from agent_cli_support import AGENTS_BIN, kvstrata_serve, write_agent_model

pytestmark = pytest.mark.slow
MODEL = "agent-model"


@pytest.fixture(scope="module")
def serve_url(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Iterator[str]:
    model = write_agent_model(tmp_path_factory.mktemp("agent") / "model", smollm2_path)
    with kvstrata_serve(model, name=MODEL) as url:
        yield url


def _claude(url: str, home: Path, workdir: Path, *args: str) -> dict[str, Any]:
    env = {
        **os.environ, "HOME": str(home), "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "sk-local",
        "ANTHROPIC_MODEL": MODEL, "ANTHROPIC_SMALL_FAST_MODEL": MODEL, "ANTHROPIC_DEFAULT_HAIKU_MODEL": MODEL,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": MODEL, "ANTHROPIC_DEFAULT_OPUS_MODEL": MODEL,
        # offline and quiet: no telemetry, error reports, update checks or other traffic off this machine
        "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    proc = subprocess.run([str(AGENTS_BIN / "claude"), "-p", *args, "--output-format", "json", "--model", MODEL],
                          cwd=workdir, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"claude exited {proc.returncode}: {proc.stdout[-2000:]} {proc.stderr[-2000:]}"
    result = json.loads(proc.stdout)
    assert result["type"] == "result" and not result["is_error"], result
    return result


def _cached_share(result: dict[str, Any]) -> float:
    u = result["usage"]
    prompt = u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
    return u["cache_read_input_tokens"] / prompt


def test_two_turns_with_resume_exit_0_and_the_second_reads_the_cache(serve_url: str, tmp_path: Path) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    first = _claude(serve_url, home, work, "List three colours.")
    second = _claude(serve_url, home, work, "And three animals?", "--resume", first["session_id"])
    assert second["session_id"] == first["session_id"]
    u = first["usage"]
    assert u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"] > 5000  # tools and all
    assert _cached_share(second) >= 0.9, second["usage"]

"""The real Codex CLI (0.171.0, `make agent-deps`) headless against a real `kvstrata serve`, two turns.

The model is agent_cli_support.py's tiny Qwen3-shaped one (random weights, replies that end by
themselves, a 32k context for Codex's ~9k-token prompt of instructions and tools) with a thinking chat
template (thinking_model.py): its generation prompt opens `<think>`, so every reply is reasoning, which
Codex gets as a `reasoning` item with encrypted_content (it sends `store: false` and `include:
["reasoning.encrypted_content"]`) and sends back in turn 2, where it is rendered again. Its tools are
functions, a namespace of sub-agent tools and the hosted web_search, which is dropped. The garbage
replies are fine: the test asserts both `codex exec` runs exit 0, the server answered one request a
turn, and turn 2's prompt came from the prefix cache (the server's /metrics counters).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from agent_cli_support import AGENTS_BIN, kvstrata_serve, write_agent_model
from thinking_model import THINKING_TEMPLATE

pytestmark = pytest.mark.slow
CODEX = AGENTS_BIN / "codex"
MODEL = "agent-model"


@pytest.fixture(scope="module")
def serve_url(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Iterator[str]:
    model = write_agent_model(tmp_path_factory.mktemp("codex") / "model", smollm2_path)
    (model / "chat_template.jinja").write_text(THINKING_TEMPLATE, encoding="utf-8")
    with kvstrata_serve(model, name=MODEL) as url:
        yield url


def _counters(url: str) -> tuple[float, float, float]:
    """(requests, prompt tokens, of them served from the prefix cache) finished so far, from /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10).text

    def total(name: str) -> float:
        return sum(float(v) for v in re.findall(rf"^kvstrata:{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.M))

    return total("request_success_total"), total("prompt_tokens_total"), total("prefix_cache_hits_total")


def _codex(args: list[str], home: Path, work: Path) -> dict[str, int]:
    """`codex exec ... --json` offline and non-interactive (its own HOME and CODEX_HOME, no stdin, bounded):
    the usage of its turn.completed event (Codex's totals over the session)."""
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "CODEX_HOME": str(home / ".codex"),
           "KVSTRATA_KEY": "unused", "NO_COLOR": "1"}
    proc = subprocess.run([str(CODEX), "exec", *args, "--skip-git-repo-check", "--json"], cwd=work, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"codex exited {proc.returncode}: {proc.stdout[-2000:]} {proc.stderr[-2000:]}"
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    [usage] = [e["usage"] for e in events if e["type"] == "turn.completed"]
    return usage


def test_exec_then_resume_exit_0_and_the_second_turn_reads_the_cache(serve_url: str, tmp_path: Path) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    (home / ".codex").mkdir(parents=True)
    work.mkdir()
    (home / ".codex/config.toml").write_text(f"""
model = "{MODEL}"
model_provider = "kvstrata"
check_for_update_on_startup = false

[analytics]
enabled = false

[model_providers.kvstrata]
name = "kvstrata"
base_url = "{serve_url}/v1"
wire_api = "responses"
env_key = "KVSTRATA_KEY"
request_max_retries = 0
stream_max_retries = 0
""")
    first = _codex(["-s", "read-only", "Say hi."], home, work)
    requests1, prompt1, cached1 = _counters(serve_url)
    second = _codex(["resume", "--last", "And once more."], home, work)
    requests2, prompt2, cached2 = _counters(serve_url)
    assert (requests1, requests2) == (1, 2)  # one /v1/responses request a turn
    assert prompt1 == first["input_tokens"] > 5000, first  # Codex's instructions and tools
    assert 0 < first["reasoning_output_tokens"] == first["output_tokens"], first  # all reasoning, counted
    # turn 2's prompt: turn 1's, its reasoning re-rendered from encrypted_content, the new line; mostly cached
    assert prompt2 - prompt1 > prompt1 and cached2 - cached1 >= 0.9 * prompt1, (prompt1, prompt2, cached2 - cached1)
    assert second["cached_input_tokens"] - first["cached_input_tokens"] == cached2 - cached1, second

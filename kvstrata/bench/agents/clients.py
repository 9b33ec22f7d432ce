"""The agent CLIs `kvstrata bench agents` drives, headless: Claude Code (`claude -p`, `--resume`) and Codex
(`codex exec`, `codex exec resume`), the pinned npm packages `make agent-deps` puts in `.agents/`.

The sessions of a run share one HOME (and CODEX_HOME) and working directory, as one user's sessions in
one project do; every variable that would send traffic off the machine (telemetry, error reports,
update checks) is off. A
turn's outcome is the CLI's exit status and its own report; the timings come from the proxy (proxy.py).
"""
from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

REPO = Path(__file__).resolve().parents[3]
AGENTS_BIN = REPO / ".agents" / "node_modules" / ".bin"
TURN_TIMEOUT_S = 900.0
PROMPTS = ("List the files here and say what this directory is for.", "Now summarize that in one line.",
           "What would you check first?", "Thanks. Anything else?")


@dataclass
class TurnResult:
    ok: bool
    session: str | None  # the CLI's session id, for the next turn's resume
    wall_s: float
    detail: str  # the error, or "" when ok


class AgentClient(Protocol):
    name: str

    def setup(self, home: Path, base_url: str, model: str) -> None: ...

    def turn(self, home: Path, work: Path, prompt: str, session: str | None) -> TurnResult: ...


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str, str, float]:
    import time

    start = time.monotonic()
    try:
        proc = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=TURN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return -1, "", f"timed out after {TURN_TIMEOUT_S:.0f} s", time.monotonic() - start
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start


class ClaudeCode:
    name = "claude-code"

    def __init__(self) -> None:
        self.env: dict[str, str] = {}
        self.model = ""

    def setup(self, home: Path, base_url: str, model: str) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self.model = model
        self.env = {
            "PATH": os.environ.get("PATH", ""), "ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": "sk-bench",
            **{k: model for k in ("ANTHROPIC_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL",
                                  "ANTHROPIC_DEFAULT_SONNET_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL")},
            "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }

    def turn(self, home: Path, work: Path, prompt: str, session: str | None) -> TurnResult:
        resume = ["--resume", session] if session else []
        argv = [str(AGENTS_BIN / "claude"), "-p", prompt, *resume, "--output-format", "json", "--model", self.model]
        code, out, err, wall = _run(argv, {**self.env, "HOME": str(home)}, work)
        try:
            result = json.loads(out)
        except ValueError:
            return TurnResult(False, session, wall, f"exit {code}: {(err or out)[-300:]}")
        ok = code == 0 and not result.get("is_error")
        return TurnResult(ok, result.get("session_id", session), wall, "" if ok else str(result.get("result"))[:300])


class Codex:
    name = "codex"

    def __init__(self) -> None:
        self.env: dict[str, str] = {}

    def setup(self, home: Path, base_url: str, model: str) -> None:
        (home / ".codex").mkdir(parents=True, exist_ok=True)  # also makes HOME
        (home / ".codex" / "config.toml").write_text(
            f'model = "{model}"\nmodel_provider = "bench"\ncheck_for_update_on_startup = false\n\n'
            "[analytics]\nenabled = false\n\n"
            f'[model_providers.bench]\nname = "bench"\nbase_url = "{base_url}/v1"\nwire_api = "responses"\n'
            'env_key = "BENCH_KEY"\nrequest_max_retries = 0\nstream_max_retries = 0\n')
        self.env = {"PATH": os.environ.get("PATH", ""), "BENCH_KEY": "sk-bench", "NO_COLOR": "1"}

    def turn(self, home: Path, work: Path, prompt: str, session: str | None) -> TurnResult:
        head = ["resume", "--last"] if session else ["-s", "read-only"]
        argv = [str(AGENTS_BIN / "codex"), "exec", *head, prompt, "--skip-git-repo-check", "--json"]
        env = {**self.env, "HOME": str(home), "CODEX_HOME": str(home / ".codex")}
        code, out, err, wall = _run(argv, env, work)
        events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        failed = [e for e in events if e.get("type") in ("turn.failed", "error")]
        ok = code == 0 and not failed
        thread = next((e.get("thread_id") for e in events if e.get("type") == "thread.started"), session)
        detail = "" if ok else (json.dumps(failed[:1])[:300] if failed else f"exit {code}: {err[-300:]}")
        return TurnResult(ok, thread, wall, detail)


CLIENTS: dict[str, type[ClaudeCode] | type[Codex]] = {"claude-code": ClaudeCode, "codex": Codex}

"""`kvstrata bench agents`: the real agent CLIs (clients.py) against each engine in turn, on the same GGUF.

For each engine and client: a fresh server (bench/compare/engines.py, context `--context`) behind the
measuring proxy (proxy.py); `--sessions` sessions one after another, `--turns` turns each (turn 1 new,
the others `--resume`). Session 1's first turn is the cold one; the later sessions' first turns find the
CLI's system prompt and tools in the cache (all sessions share one HOME and working directory, as one
user's sessions in one project do: Claude Code writes both into its system prompt). For kvstrata, with `--restart-l3` (the default), the server
runs with the `file` L3 and is restarted once the sessions are done, and one more new session's first
turn is measured on the new process. Per turn: the main request's TTFT (the one with the longest prompt;
a CLI may send small side requests too), its prompt tokens and cached share, the turn's requests and wall
time, and whether the CLI succeeded. The JSON goes to `--out-dir`, with the machine.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvstrata.bench.agents.clients import AGENTS_BIN, CLIENTS, PROMPTS, AgentClient
from kvstrata.bench.agents.proxy import Exchange, MeasuringProxy
from kvstrata.bench.compare.engines import ENGINES, EngineUnavailable, RunningServer
from kvstrata.bench.machine import with_machine
from kvstrata.bench.paths import portable_tree
from kvstrata.serving.ports import free_port

SERVED = "smollm2"  # the name every engine of bench/compare/engines.py serves under


def add_agents_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--client", default="claude-code,codex", help=f"of {', '.join(CLIENTS)} (default: %(default)s)")
    parser.add_argument("--engines", default="kvstrata,vllm,llamacpp", help="run in this order (default: %(default)s)")
    parser.add_argument("--model-file", required=True,
                        help="the GGUF every engine serves, of >= --context positions (e.g. `kvstrata bench "
                             "synth-model --shape qwen3-0.6b --quant Q8_0 --ends-replies`)")
    parser.add_argument("--sessions", type=int, default=2, help="sessions one after another (default: %(default)s)")
    parser.add_argument("--turns", type=int, default=3, help=f"turns a session, 1-{len(PROMPTS)} (default: %(default)s)")
    parser.add_argument("--context", type=int, default=32768, help="each engine's context (default: %(default)s)")
    parser.add_argument("--no-restart-l3", dest="restart_l3", action="store_false",
                        help="skip kvstrata's restart over the file L3")
    parser.add_argument("--out-dir", type=Path, default=Path("bench/results"))


@dataclass
class Turn:
    engine: str
    client: str
    session: int  # 1-based; "restart" turns are in a session after the restart
    turn: int
    ok: bool
    wall_s: float
    requests: int
    ttft_s: float | None
    prompt_tokens: int | None
    cached_tokens: int | None
    after_restart: bool = False
    detail: str = ""

    @property
    def cached_share(self) -> float | None:
        return None if not self.prompt_tokens or self.cached_tokens is None else self.cached_tokens / self.prompt_tokens


def _engine_args(engine: str, context: int, store: Path | None) -> list[str]:
    if engine.startswith("kvstrata"):  # a KV pool of two contexts (a session and the shared prefix of the
        # next), and an L2 of 4 GB: the default ratio (2x L1) asks for twice the pool again in host memory
        extra = ["--max-model-len", str(context), "--max-total-tokens", str(2 * context), "--kvstore-size", "4"]
        if store is not None:
            extra += ["--kvstore-storage-backend", "file", "--kvstore-storage-backend-extra-config",
                      json.dumps({"path": str(store)})]
        return extra
    if engine == "llamacpp":  # one slot of the whole context (sessions run one at a time); --jinja: the GGUF's
        return ["-c", str(context), "-np", "1", "--jinja"]  # template, with the tools written into the prompt
    # vLLM refuses tool_choice "auto" without a parser (Claude Code sends tools on every request)
    return ["--max-model-len", str(context), "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]


def main_exchange(exchanges: list[Exchange]) -> Exchange | None:
    """The turn's first request of the agent's whole prompt (at least half the longest one's): a CLI may
    send it twice, or small side requests beside it; the first is the one its user waits for."""
    longest = max((e.prompt_tokens or 0 for e in exchanges), default=0)
    return next((e for e in exchanges if (e.prompt_tokens or 0) >= longest / 2), None)


def _turn(client: AgentClient, proxy: MeasuringProxy, home: Path, work: Path, prompt: str,
          session: str | None) -> tuple[Any, list[Exchange]]:
    before = len(proxy.exchanges)
    result = client.turn(home, work, prompt, session)
    time.sleep(0.2)  # the proxy records an exchange once its stream is closed
    return result, proxy.exchanges[before:]


def _run_sessions(engine: str, client: AgentClient, proxy: MeasuringProxy, root: Path, first: int, count: int,
                  turns: int, after_restart: bool) -> list[Turn]:
    out: list[Turn] = []
    home, work = root / "home", root / "work"  # one user in one project: Claude Code's system prompt names both
    work.mkdir(parents=True, exist_ok=True)
    (work / "README.md").write_text("A small project the agent looks at.\n")
    client.setup(home, proxy.url, SERVED)
    for s in range(first, first + count):
        session = None
        for t in range(1, turns + 1):
            result, exchanges = _turn(client, proxy, home, work, PROMPTS[t - 1], session)
            session = result.session
            main = main_exchange(exchanges)
            out.append(Turn(engine, client.name, s, t, result.ok, round(result.wall_s, 3), len(exchanges),
                            None if main is None or main.ttft_s is None else round(main.ttft_s, 4),
                            None if main is None else main.prompt_tokens, None if main is None else main.cached_tokens,
                            after_restart, result.detail))
            print(f"{engine} {client.name} session {s} turn {t}: {asdict(out[-1])}", file=sys.stderr)
            if not result.ok:
                break
    return out


def _kv_gb(model_file: str, tokens: int) -> int:
    """GB of KV cache `tokens` tokens of the model take in bf16, rounded up (vLLM CPU's KV space)."""
    from kvstrata.model.weights import load_weights

    a = load_weights(model_file).arch
    return -(-a.num_layers * a.num_kv_heads * a.head_dim * 2 * 2 * tokens // 10**9)


def _run_engine(engine: str, client: AgentClient, args: argparse.Namespace, root: Path) -> list[Turn]:
    restart = args.restart_l3 and engine.startswith("kvstrata")
    store = root / "kvstore" if restart else None
    extra = _engine_args(engine, args.context, store)
    if engine.startswith("vllm"):  # bench/peers/vllm_serve.sh's 2 GB holds less than one context of most models
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(max(2, _kv_gb(args.model_file, 2 * args.context)))
    turns: list[Turn] = []
    for phase in ("sessions", "restart") if restart else ("sessions",):
        port = free_port()
        log = root / f"{engine}-{client.name}-{phase}.log"
        with RunningServer(ENGINES[engine], port, args.model_file, log, extra) as server:
            server.wait_healthy()
            proxy = MeasuringProxy(server.url, free_port()).start()
            try:
                if phase == "sessions":
                    turns += _run_sessions(engine, client, proxy, root, 1, args.sessions, args.turns, False)
                else:
                    turns += _run_sessions(engine, client, proxy, root, args.sessions + 1, 1, 1, True)
            finally:
                proxy.stop()
    return turns


def summary(turns: list[Turn]) -> list[dict[str, Any]]:
    """Per engine and client: cold TTFT, a new session's first turn, later turns' TTFT p50 and cached share."""
    rows = []
    for key in dict.fromkeys((t.engine, t.client) for t in turns):
        mine = [t for t in turns if (t.engine, t.client) == key]
        cold = next((t.ttft_s for t in mine if t.session == 1 and t.turn == 1), None)
        later = [t for t in mine if t.turn >= 2 and t.ttft_s is not None]
        new = [t.ttft_s for t in mine if t.session > 1 and t.turn == 1 and not t.after_restart and t.ttft_s]
        restart = [t.ttft_s for t in mine if t.after_restart and t.ttft_s]
        shares = [t.cached_share for t in later if t.cached_share is not None]
        rows.append({
            "engine": key[0], "client": key[1], "turns": len(mine), "errors": sum(not t.ok for t in mine),
            "cold_ttft_s": cold,
            "later_ttft_p50_s": statistics.median([t.ttft_s for t in later]) if later else None,  # type: ignore[misc]
            "later_cached_share_p50": statistics.median(shares) if shares else None,
            "new_session_ttft_s": statistics.median(new) if new else None,
            "new_session_vs_cold": statistics.median(new) / cold if new and cold else None,
            "after_restart_ttft_s": restart[0] if restart else None,
            "after_restart_vs_cold": restart[0] / cold if restart and cold else None,
        })
    return rows


def run_agents(args: argparse.Namespace) -> int:
    clients = [c.strip() for c in args.client.split(",") if c.strip()]
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    bad = [c for c in clients if c not in CLIENTS] + [e for e in engines if e not in ENGINES]
    if bad or not 1 <= args.turns <= len(PROMPTS) or args.sessions < 1:
        print(f"unknown client or engine {bad}, or --turns outside 1-{len(PROMPTS)}, or --sessions < 1", file=sys.stderr)
        return 2
    if not (AGENTS_BIN / "claude").exists():
        print("the agent CLIs are missing: run `make agent-deps`", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="kvstrata-bench-agents-"))
    turns: list[Turn] = []
    skipped: dict[str, str] = {}
    for engine in engines:
        for name in clients:
            try:
                turns += _run_engine(engine, CLIENTS[name](), args, root)
            except EngineUnavailable as exc:
                skipped[engine] = str(exc)
                print(f"skipping {engine}: {exc}", file=sys.stderr)
                break
    report = with_machine({
        "command": f"kvstrata bench agents --client {args.client} --engines {args.engines} --model-file "
                   f"{Path(args.model_file).name} --sessions {args.sessions} --turns {args.turns} --context {args.context}"
                   + ("" if args.restart_l3 else " --no-restart-l3"),
        "model_file": Path(args.model_file).name,
        "summary": summary(turns), "turns": [asdict(t) for t in turns], "skipped": skipped,
    })
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"agents-{time.strftime('%Y-%m-%d-%H%M')}.json"
    out.write_text(json.dumps(portable_tree(report), indent=1))
    for row in report["summary"]:
        print(json.dumps(row))
    print(f"wrote {out}", file=sys.stderr)
    return 0

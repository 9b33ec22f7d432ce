"""`kvstrata bench fleet`: an agent fleet behind `kvstrata serve --dp-size N`, once per routing policy.

For each `--policies` entry in turn: a fresh `kvstrata serve --dp-size N --policy P` (bench/compare/engines.py's
launcher, every rank on the same model), started empty; then the workload of workload.py: `--sessions`
sessions sharing a `--prefix-tokens` system prompt, session i sending its first turn `i * --join-gap` s after
the first, each turn as soon as its previous reply is in (so, once all have joined, all run at once), every
request streamed with the session's `prompt_cache_key`. Per policy: each rank's share of the requests, hit
efficiency (cached tokens / achievable), TTFT p50/p99 of first and later turns, and the run's duration
(workload.fleet_figures). Later-turn TTFT p50 is also given as a ratio to the first policy's. The JSON
goes to `--out-dir`, with the machine.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from kvstrata.bench.client import ChatClient, RequestRecord
from kvstrata.bench.compare.engines import ENGINES, EngineUnavailable, RunningServer
from kvstrata.bench.fleet.workload import FleetConfig, FleetWorkload, fleet_figures
from kvstrata.bench.machine import with_machine
from kvstrata.bench.paths import portable_tree
from kvstrata.router.policy import POLICIES
from kvstrata.serving.ports import free_port

SERVED = "smollm2"  # the name bench/compare/engines.py's kvstrata serves under


def add_fleet_args(parser: argparse.ArgumentParser) -> None:
    d = FleetConfig()
    parser.add_argument("--policies", default="cost,cache_aware",
                        help=f"routing policies run one after another, of {', '.join(sorted(POLICIES))}; the first is the "
                        "baseline of the ratios (default: %(default)s)")
    parser.add_argument("--dp-size", type=int, default=2, help="ranks (default: %(default)s)")
    parser.add_argument("--model", default="smollm2", help="what every rank serves (default: %(default)s)")
    parser.add_argument("--sessions", type=int, default=d.sessions, help="sessions (default: %(default)s)")
    parser.add_argument("--prefix-tokens", type=int, default=d.prefix_tokens,
                        help="the system prompt every session shares (default: %(default)s)")
    parser.add_argument("--turns", type=int, default=d.turns, help="turns a session (default: %(default)s)")
    parser.add_argument("--turn-tokens", type=int, default=d.turn_tokens, help="each user message (default: %(default)s)")
    parser.add_argument("--join-gap", type=float, default=d.join_gap_s,
                        help="seconds between two sessions' first requests (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=d.max_tokens, help="each reply (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--kvstrata-args", default="", help="more `serve` flags for every run, e.g. \"--max-total-tokens 16384\"")
    parser.add_argument("--out-dir", type=Path, default=Path("bench/results"))


def fleet_config(args: argparse.Namespace) -> FleetConfig:
    return FleetConfig(sessions=args.sessions, prefix_tokens=args.prefix_tokens, turns=args.turns,
                       turn_tokens=args.turn_tokens, join_gap_s=args.join_gap, max_tokens=args.max_tokens, seed=args.seed)


async def drive(url: str, workload: FleetWorkload) -> tuple[list[RequestRecord], float]:
    """Every session's turns against `url`; the requests in the order they were sent, and the run's seconds."""
    cfg = workload.config
    done: list[RequestRecord] = []
    start = time.perf_counter()

    async def session(s: int, client: ChatClient) -> None:
        await asyncio.sleep(s * cfg.join_gap_s)
        replies: list[str] = []
        for turn in range(cfg.turns):
            messages = workload.messages(s, replies)
            r = await client.chat(messages, {"prompt_cache_key": f"fleet-session-{s}"})
            done.append(RequestRecord(s, 0, turn, "user", messages, r))
            if not r.ok:
                print(f"session {s} turn {turn}: {r.error}", file=sys.stderr)
                return
            replies.append(r.text)

    async with ChatClient(url, SERVED, max_tokens=cfg.max_tokens, timeout_s=1800.0) as client:
        await asyncio.gather(*(session(s, client) for s in range(cfg.sessions)))
    return sorted(done, key=lambda r: r.result.t_sent), time.perf_counter() - start


def wait_matching(url: str, ranks: int, timeout_s: float = 300.0) -> None:
    """Until every rank is ready and the gateway matches prompts (its tokenizer loads after a rank is up)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        body = httpx.get(url + "/health", timeout=5).json()
        if sum(r["status"] == "ready" for r in body["ranks"]) == ranks and body.get("prompt_matching") != "loading":
            return
        time.sleep(0.5)
    raise EngineUnavailable(f"the gateway's {ranks} ranks were not all ready in {timeout_s:.0f} s")


def run_policy(policy: str, args: argparse.Namespace, workload: FleetWorkload, tokenizer: Any, log: Path) -> dict[str, Any]:
    from kvstrata.bench.achievable import achievable_tokens, sent_sequence

    port = free_port()
    extra = ["--dp-size", str(args.dp_size), "--policy", policy, *shlex.split(args.kvstrata_args)]
    with RunningServer(ENGINES["kvstrata"], port, args.model, log, extra) as server:
        server.wait_healthy()
        wait_matching(server.url, args.dp_size)
        info = httpx.get(server.url + "/v1/kvstrata/info", timeout=10).json()
        records, seconds = asyncio.run(drive(server.url, workload))
    reach = achievable_tokens([sent_sequence(r, tokenizer) for r in records], int(info.get("page_size") or 16))
    return {"policy": policy, **fleet_figures(records, reach, args.dp_size, seconds), "requests_log": [
        {"session": r.session_id, "turn": r.turn, "rank": r.result.rank, "ttft_s": r.result.ttft_s,
         "cached_tokens": r.result.cached_tokens, "prompt_tokens": r.result.prompt_tokens, "achievable": a,
         "error": r.result.error} for r, a in zip(records, reach)]}


def run_fleet(args: argparse.Namespace) -> int:
    from kvstrata.bench.achievable import load_tokenizer
    from kvstrata.model.fetch import resolve_model

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    try:
        if not policies or any(p not in POLICIES for p in policies) or args.dp_size < 2:
            raise ValueError(f"--policies must name some of {', '.join(sorted(POLICIES))}, and --dp-size be >= 2")
        shlex.split(args.kvstrata_args)  # unbalanced quotes: ValueError
        workload = FleetWorkload(fleet_config(args))
    except ValueError as exc:
        print(f"kvstrata bench fleet: {exc}", file=sys.stderr)
        return 2
    tokenizer = load_tokenizer(str(resolve_model(args.model)))

    args.out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d-%H%M")
    runs = []
    for policy in policies:
        try:
            runs.append(run_policy(policy, args, workload, tokenizer, args.out_dir / "logs" / f"fleet-{stamp}-{policy}.log"))
        except EngineUnavailable as exc:
            print(f"kvstrata bench fleet: {policy}: {exc}", file=sys.stderr)
            return 1
        print(json.dumps({k: v for k, v in runs[-1].items() if k != "requests_log"}), flush=True)
    base = runs[0].get("later_ttft_p50_s")
    for run in runs:
        p50 = run.get("later_ttft_p50_s")
        run["later_ttft_p50_vs_first_policy"] = round(p50 / base, 3) if p50 and base else None
    cfg = workload.config
    report = with_machine({
        "command": f"kvstrata bench fleet --policies {args.policies} --dp-size {args.dp_size} --model {args.model} "
                   f"--sessions {cfg.sessions} --prefix-tokens {cfg.prefix_tokens} --turns {cfg.turns} "
                   f"--turn-tokens {cfg.turn_tokens} --join-gap {cfg.join_gap_s} --max-tokens {cfg.max_tokens}"
                   + (f" --kvstrata-args \"{args.kvstrata_args}\"" if args.kvstrata_args else ""),
        "runs": runs,
    })
    out = args.out_dir / f"fleet-{stamp}.json"
    out.write_text(json.dumps(portable_tree(report), indent=1))
    print(f"wrote {out}", file=sys.stderr)
    return 0

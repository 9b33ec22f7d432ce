"""`kvstrata bench agentic`: drive interleaved multi-turn agent sessions against a server.

Every session is one coroutine: it sends turn i (the whole history), waits for the reply, appends
the real reply to its history and only then sends turn i + 1. All sessions run at once, so their
turns interleave and the server must hold many histories. Load is shaped by a gate in front of
every send:
- `--concurrency N` (closed loop): at most N requests in flight; a session whose reply arrived
  queues behind the sessions already waiting (asyncio.Semaphore wakes waiters in FIFO order);
- `--request-rate R` (open loop): arrivals are a seeded Poisson process of rate R/s; each arrival
  starts the turn of the session that has waited longest. An arrival that finds no session ready
  is kept, so the offered rate over the run stays R even when replies are slow.
A failed request ends its session (later turns would need the reply); the error is recorded.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import sys
from dataclasses import asdict, dataclass
from typing import Protocol, Sequence

from tqdm import tqdm

from kvstrata.bench.achievable import load_tokenizer
from kvstrata.bench.agentic.scan import ScanConfig, run_scan, session_hints
from kvstrata.bench.agentic.workload import AgenticConfig, Session, generate_agentic
from kvstrata.bench.args import check_client_arguments
from kvstrata.bench.client import ChatClient, RequestRecord
from kvstrata.bench.report import build_report, format_table, write_json


class Conversations(Protocol):
    """What the driver needs of a workload: sessions of turns, and the history each turn re-sends.

    `AgenticWorkload` and `MultiRoundWorkload` (multiround/workload.py) both are.
    """

    @property
    def sessions(self) -> Sequence[Session]: ...

    @property
    def num_requests(self) -> int: ...

    def messages(self, session_id: int, replies: list[str]) -> list[dict[str, str]]: ...


class _Gate:
    """Admits one request; `await gate.acquire()` before the send, `gate.release()` after."""

    def __init__(self, concurrency: int | None, request_rate: float | None, seed: int) -> None:
        if request_rate is None and (concurrency is None or concurrency < 1):
            raise ValueError("--concurrency must be >= 1 (or give --request-rate)")
        if request_rate is not None and request_rate <= 0:
            raise ValueError("--request-rate must be > 0 requests/s")
        self.rate = request_rate
        self._slots = asyncio.Semaphore(concurrency or 1)
        self._arrivals: asyncio.Queue[None] = asyncio.Queue()
        self._rng = random.Random(f"kvstrata-agentic:{seed}:arrivals")

    async def arrive(self, total: int) -> None:
        """Poisson arrivals (rate mode only): `total` of them, exponential gaps."""
        for _ in range(total):
            await asyncio.sleep(self._rng.expovariate(self.rate or 1.0))
            self._arrivals.put_nowait(None)

    async def acquire(self) -> None:
        if self.rate is None:
            await self._slots.acquire()
        else:
            await self._arrivals.get()

    def release(self) -> None:
        if self.rate is None:
            self._slots.release()


async def drive_agentic(
    workload: Conversations,
    client: ChatClient,
    concurrency: int | None,
    request_rate: float | None = None,
    seed: int = 0,
    progress: bool = True,
    desc: str = "agentic",
    scan: ScanConfig | None = None,
) -> list[RequestRecord]:
    """Run every session to its last turn (or first error); records in completion order. With a
    `scan` (agentic/scan.py): think time between turns, cache hints, and one-off prompts beside them; the
    scan's summary goes to `drive_agentic.last_scan`."""
    scan = scan or ScanConfig()
    gate = _Gate(concurrency, request_rate, seed)
    records: list[RequestRecord] = []
    bar = tqdm(total=workload.num_requests, desc=desc, unit="req", disable=not progress)

    async def run_session(session_id: int) -> None:
        session = workload.sessions[session_id]
        replies: list[str] = []
        hints = session_hints(scan, session_id, seed)
        for turn in range(len(session.turns)):
            messages = workload.messages(session_id, replies)
            if turn and scan.think_time:
                await asyncio.sleep(scan.think_time)  # the agent runs a tool between turns
            await gate.acquire()
            try:
                result = await client.chat(messages, hints)
            finally:
                gate.release()
            kind = session.turns[turn].kind
            records.append(RequestRecord(session_id, session.agent_id, turn, kind, messages, result))
            bar.update(1)
            if not result.ok:
                bar.total -= len(session.turns) - turn - 1
                bar.set_postfix(errors=sum(not r.result.ok for r in records))
                return
            replies.append(result.text)

    arrivals = asyncio.create_task(gate.arrive(workload.num_requests)) if request_rate else None
    done = asyncio.Event()
    scanning = asyncio.create_task(run_scan(client, scan, seed, done)) if scan.prompts else None
    try:
        await asyncio.gather(*(run_session(s.session_id) for s in workload.sessions))
        done.set()
        if scanning is not None:
            last_scan.clear()
            last_scan.update(await scanning)  # the prompt in flight finishes
    finally:
        done.set()
        if scanning is not None and not scanning.done():
            scanning.cancel()
            await asyncio.gather(scanning, return_exceptions=True)
        if arrivals is not None:
            arrivals.cancel()
            await asyncio.gather(arrivals, return_exceptions=True)
        bar.close()
    return records


last_scan: dict[str, int] = {}  # the scan summary of the latest drive_agentic run


def agentic_config(args: argparse.Namespace) -> AgenticConfig:
    """The workload the flags describe (ValueError naming a bad flag); `--system-tokens` None = 1500."""
    system = 1500 if args.system_tokens is None else args.system_tokens
    config = AgenticConfig(agents=args.agents, sessions=args.sessions, turns=args.turns,
                           system_tokens=system, turn_tokens=args.turn_tokens, seed=args.seed)
    config.validate()
    check_client_arguments(args)
    ScanConfig.from_args(args)
    return config


def run_agentic_workload(
    args: argparse.Namespace, url: str, config: AgenticConfig, tokenizer: object, progress: bool = True
) -> dict[str, object]:
    """Drive `config`'s sessions against `url` with the client flags; the report dict (the JSON file)."""
    workload = generate_agentic(config)
    concurrency = None if args.request_rate else args.concurrency
    scan = ScanConfig.from_args(args)

    async def run() -> list[RequestRecord]:
        connections = max(concurrency or 0, config.sessions) + 1
        async with ChatClient(url, args.model, args.max_tokens, max_connections=connections) as c:
            return await drive_agentic(workload, c, concurrency, args.request_rate, config.seed, progress=progress,
                                       scan=scan)

    last_scan.clear()
    records = asyncio.run(run())
    meta = {"workload": "agentic", "url": url, "model": args.model, "tokenizer": args.tokenizer,
            "max_tokens": args.max_tokens, "concurrency": concurrency, "request_rate": args.request_rate,
            "page_size": args.page_size, **asdict(config), "think_time": scan.think_time,
            "cache_hints": scan.cache_hints}
    report = build_report(records, tokenizer, args.page_size, meta)
    if scan.prompts:
        report["scan"] = dict(last_scan)
    return report


def main(args: argparse.Namespace) -> int:
    """The `bench agentic` command: generate, drive, report. Returns the process exit code."""
    try:
        config = agentic_config(args)
        tokenizer = load_tokenizer(args.tokenizer)  # before the run: a bad path fails fast
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"agentic: {config.sessions * config.turns} requests ({config.sessions} sessions x {config.turns} turns,"
        f" {config.agents} agents) -> {args.url} model={args.model}",
        file=sys.stderr,
    )
    report = run_agentic_workload(args, args.url, config, tokenizer)
    print(format_table(report))
    if "scan" in report:
        print(f"scan: {report['scan']} (not in the figures above: they are the agents')")
    if args.output:
        write_json(report, args.output)
        print(f"wrote {args.output}", file=sys.stderr)
    return 1 if report["errors"] else 0

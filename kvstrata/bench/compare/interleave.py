"""`bench compare --workload throughput --interleave`: every engine up at once, the probe's measurements
taken in turns.

This VM's speed moves by up to 2x within minutes, so two engines probed one after the other can meet
different machines: a 128-token decode window is ~10 s, and one run's b1 ratio came out 1.44x and the
next 0.93x (docs/benchmarks.md). Here the engines start one after another (each start timed alone)
and stay up, idle while the other is measured, and each round takes one cold prompt from every engine,
then each decode batch from every engine, the order rotated by one engine each round, so each engine's
figure comes from the same minutes as the others'. `--probe-repeats` is the number of rounds; every
measurement is kept by round (`rounds`), and the table is followed by the ratios of the first engine
to each other one in every round, so the spread is on the page beside the means. Each engine serves
on its own port (`--port` + its index); memory is read from each server's own processes at the end.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
from contextlib import AsyncExitStack, ExitStack
from pathlib import Path
from typing import Any

from kvstrata.bench.client import ChatResult
from kvstrata.bench.compare.engines import ENGINES, EngineUnavailable, RunningServer
from kvstrata.bench.compare.table import Report
from kvstrata.bench.throughput.probe import (ProbeConfig, batches, clients, decode_once, prefill_once, probe_rng,
                                             summary, warm_once)


def check_interleave(args: argparse.Namespace, engines: list[str]) -> None:
    """ValueError where --interleave cannot run as asked (before any engine starts)."""
    if args.workload != "throughput" or args.no_throughput:
        raise ValueError("--interleave takes turns over the throughput probe: use it with --workload throughput")
    if len(set(engines)) != len(engines) or len(engines) < 2:
        raise ValueError("--interleave needs two or more different engines")
    if args.port + len(engines) > 65536:
        raise ValueError(f"--port {args.port}: the engines serve on --port and the {len(engines) - 1} above it")


def _start(names: list[str], args: argparse.Namespace, out_dir: Path, stem: str,
           stack: ExitStack) -> tuple[dict[str, RunningServer], dict[str, Report]]:
    """Each engine started and waited for in turn; those that could not start are reported as errors."""
    from kvstrata.bench.compare.workloads import serve_extra

    servers: dict[str, RunningServer] = {}
    reports: dict[str, Report] = {}
    for i, name in enumerate(names):
        extra = serve_extra(name, args)
        port = args.port + i
        print(f"compare: starting {name} on port {port} {' '.join(extra)}".rstrip(), file=sys.stderr)
        try:
            srv = stack.enter_context(RunningServer(ENGINES[name], port, args.tokenizer,
                                                    out_dir / "logs" / f"{stem}-{name}.log", extra))
            startup_s = srv.wait_healthy()
        except EngineUnavailable as exc:
            print(f"compare: skipping {name}: {exc}", file=sys.stderr)
            reports[name] = {"error": str(exc)}
            continue
        print(f"compare: {name} ready after {startup_s:.0f} s", file=sys.stderr)
        servers[name] = srv
        reports[name] = {"meta": {"workload": "throughput", "url": srv.url, "model": args.model, "engine": name,
                                  "startup_s": startup_s, "serve_args": extra, "interleaved": True}}
    return servers, reports


async def interleaved_probe(urls: dict[str, str], model: str, config: ProbeConfig) -> dict[str, dict[str, Any]]:
    """The probe against every server, in rounds (module docstring); each engine's report as the probe's,
    plus `rounds`: [{"prefill": tokens/s, "1": tokens/s, ...}] in round order."""
    names = list(urls)
    rngs = {n: probe_rng(config) for n in names}
    failed: dict[str, list[ChatResult]] = {n: [] for n in names}
    prefill: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    decode: dict[str, dict[str, list[dict[str, Any]]]] = {n: {str(b): [] for b in batches(config)} for n in names}
    rounds: dict[str, list[dict[str, float | None]]] = {n: [] for n in names}
    async with AsyncExitStack() as stack:
        ones, manys = {}, {}
        for n in names:
            one, many = clients(urls[n], model, config)
            ones[n], manys[n] = await stack.enter_async_context(one), await stack.enter_async_context(many)
        for n in names:
            await warm_once(ones[n], rngs[n], failed[n])
        for r in range(config.repeats):
            order = names[r % len(names):] + names[:r % len(names)]
            row: dict[str, dict[str, float | None]] = {n: {} for n in names}
            for n in order:
                p = await prefill_once(ones[n], rngs[n], config, failed[n])
                prefill[n] += [p] if p is not None else []
                row[n]["prefill"] = p["tokens_per_s"] if p is not None else None
            for b in batches(config):
                for n in order:
                    d = await decode_once(manys[n], rngs[n], b, failed[n])
                    decode[n][str(b)].append(d)
                    row[n][str(b)] = d["tokens_per_s"]
            for n in names:
                rounds[n].append(row[n])
    out = {}
    for n in names:
        means = {b: _mean_rate(runs) for b, runs in decode[n].items()}
        out[n] = {**summary(prefill[n], means, failed[n], config), "rounds": rounds[n]}
    return out


def _mean_rate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One batch's decode over the rounds: the mean of the rounds' rates, and each round's decode_rate."""
    rates = [d["tokens_per_s"] for d in runs if d["tokens_per_s"] is not None]
    return {"tokens_per_s": sum(rates) / len(rates) if rates else None, "runs": runs}


def run_interleaved(names: list[str], args: argparse.Namespace, config: ProbeConfig, out_dir: Path,
                    stem: str) -> dict[str, Report]:
    """Start every engine, probe them in turns, stop them: each engine's report (or {"error": why})."""
    from kvstrata.bench.proc_memory import session_memory
    from kvstrata.bench.throughput.probe import format_probe

    with ExitStack() as stack:
        servers, reports = _start(names, args, out_dir, stem, stack)
        if servers:
            print(f"compare: probing {', '.join(servers)} in turns, {config.repeats} round(s)", file=sys.stderr)
            probes = asyncio.run(interleaved_probe({n: s.url for n, s in servers.items()}, args.model, config))
            for n, srv in servers.items():
                reports[n]["meta"].update(session_memory(srv.proc.pid).meta())
                reports[n].update(errors=probes[n]["errors"], throughput=probes[n])
                print(f"compare: {n}: {format_probe(probes[n])}", file=sys.stderr)
    return reports


def ratio_lines(results: dict[str, Report]) -> list[str]:
    """Markdown lines: the first engine's figure over each other engine's, round by round."""
    ok = [n for n, r in results.items() if "rounds" in (r.get("throughput") or {})]
    if len(ok) < 2:
        return []
    first, lines = ok[0], []
    for other in ok[1:]:
        mine, theirs = results[first]["throughput"]["rounds"], results[other]["throughput"]["rounds"]
        cells = []
        for key in mine[0]:
            label = "cold prefill" if key == "prefill" else f"decode b{key}"
            ratios = [f"{a[key] / b[key]:.2f}x" if a.get(key) and b.get(key) else "n/a" for a, b in zip(mine, theirs)]
            cells.append(f"{label} {', '.join(ratios)}")
        lines.append(f"{first} / {other} by round: {'; '.join(cells)}")
    return lines

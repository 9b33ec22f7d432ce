"""`kvstrata bench compare`: the same workload through the same client against each engine in turn.

For each engine of `--engines` (a name in engines.py's `ENGINES`: kvstrata and its pinned variants,
vllm and its speculative variants, llamacpp): start its server on the same model, wait for /health,
run the workload (`--workload`, an entry of the registry in workloads.py: agentic, multiround, repeat,
throughput, edit or trace), then the throughput probe
(kvstrata/bench/throughput/probe.py: cold prefill and decode tokens/s over HTTP; `--no-throughput`
skips it), stop it. Then write `<out-dir>/<workload>-<date>.json` (every engine's full report), `.md`
(a table: the workload's columns, then the probe's) and PNG plots (plots.py).
"""
from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import Any

from kvstrata.bench.args import add_client_arguments
from kvstrata.bench.compare.engines import ENGINES, EngineUnavailable, RunningServer
from kvstrata.bench.compare.interleave import check_interleave, ratio_lines, run_interleaved
from kvstrata.bench.paths import portable, portable_tree


def add_compare_args(parser: argparse.ArgumentParser) -> None:
    from kvstrata.bench.compare.workloads import COMPARE_WORKLOADS, add_probe_args

    group = parser.add_argument_group("compare")
    group.add_argument("--workload", default="agentic", choices=list(COMPARE_WORKLOADS),
                       help="workload to run (default: %(default)s)")
    group.add_argument("--engines", default="kvstrata,vllm",
                       help=f"comma-separated, run in this order; of {', '.join(ENGINES)} (default: %(default)s)")
    group.add_argument("--port", type=int, default=8300, help="port each engine serves on, in turn (default: %(default)s)")
    group.add_argument("--out-dir", default="bench/results", help="where the JSON, table and plots go (default: %(default)s)")
    group.add_argument("--no-plots", action="store_true", help="skip the PNG plots (no matplotlib needed)")
    group.add_argument("--interleave", action="store_true",
                       help="throughput only: start every engine (on --port, --port + 1, ...) and take the probe's "
                            "measurements in turns, --probe-repeats rounds (interleave.py)")
    group.add_argument("--kvstrata-args", default="",
                       help="extra `kvstrata serve` flags, after the workload's own (e.g. repeat's "
                            "'--response-cache-size 1024'; a later flag wins)")
    group.add_argument("--system-tokens", type=int, default=None,
                       help="shared system prompt size (default: agentic 1500, multiround 1000)")
    for workload in COMPARE_WORKLOADS.values():
        workload.add_arguments(parser)
    add_probe_args(parser)
    add_client_arguments(parser)


def _check(args: argparse.Namespace, engines: list[str]) -> None:
    """Raise ValueError (exit 2) on anything that would fail after a server started."""
    from kvstrata.bench.achievable import load_tokenizer
    from kvstrata.bench.compare.workloads import COMPARE_WORKLOADS, probe_config

    unknown = [e for e in engines if e not in ENGINES]
    if unknown or not engines:
        raise ValueError(f"unknown engine(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(ENGINES)}")
    shlex.split(args.kvstrata_args)  # unbalanced quotes: ValueError
    COMPARE_WORKLOADS[args.workload].check(args)
    if args.interleave:
        check_interleave(args, engines)
    if not args.no_throughput:
        probe_config(args).validate()
    if COMPARE_WORKLOADS[args.workload].needs_tokenizer:
        load_tokenizer(args.tokenizer)


def run_engine(name: str, args: argparse.Namespace, out_dir: Path, stem: str) -> dict[str, Any]:
    """Start one engine, run the workload and the probe, stop it; its report (or {"error": why})."""
    from kvstrata.bench.compare.workloads import COMPARE_WORKLOADS, probe_config, serve_extra
    from kvstrata.bench.proc_memory import session_memory
    from kvstrata.bench.throughput.probe import format_probe, probe_throughput

    workload = COMPARE_WORKLOADS[args.workload]
    extra = serve_extra(name, args)
    print(f"compare: starting {name} on port {args.port} {' '.join(extra)}".rstrip(), file=sys.stderr)
    try:
        with RunningServer(ENGINES[name], args.port, args.tokenizer, out_dir / "logs" / f"{stem}-{name}.log",
                           extra) as srv:
            startup_s = srv.wait_healthy()
            print(f"compare: {name} ready after {startup_s:.0f} s; running {args.workload}", file=sys.stderr)
            started = time.monotonic()
            report = workload.run(args, srv.url)
            report.setdefault("meta", {}).update(engine=name, startup_s=startup_s, wall_s=time.monotonic() - started,
                                                 serve_args=extra)
            print(f"--- {name}\n{workload.describe(report)}".rstrip(), file=sys.stderr)
            if workload.probe_after and not args.no_throughput:
                print(f"compare: {name}: throughput probe", file=sys.stderr)
                report["throughput"] = probe_throughput(srv.url, args.model, probe_config(args))
            if report.get("throughput"):
                print(f"compare: {name}: {format_probe(report['throughput'])}", file=sys.stderr)
            report["meta"].update(session_memory(srv.proc.pid).meta())  # the server and every process it started
    except EngineUnavailable as exc:
        print(f"compare: skipping {name}: {exc}", file=sys.stderr)
        return {"error": str(exc)}
    return report


def _interrupt(sig: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run_compare(args: argparse.Namespace) -> int:
    from kvstrata.bench.compare.table import markdown_table, server_columns, throughput_columns
    from kvstrata.bench.compare.workloads import COMPARE_WORKLOADS, probe_config, workload_plot
    from kvstrata.bench.machine import machine_info, machine_line

    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    try:
        _check(args, engines)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    workload = COMPARE_WORKLOADS[args.workload]
    out_dir = Path(args.out_dir)
    stem = f"{args.workload}-{datetime.now(timezone.utc):%Y-%m-%d}"
    previous = signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM unwinds like Ctrl-C: servers are stopped
    try:
        if args.interleave:
            results = run_interleaved(engines, args, probe_config(args), out_dir, stem)
        else:
            results = {name: run_engine(name, args, out_dir, stem) for name in engines}
    except KeyboardInterrupt:
        print("compare: interrupted; the servers it started are stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    argv = sys.argv[3:] if sys.argv[1:3] == ["bench", "compare"] else []  # as typed, when run from the shell
    command = portable(" ".join(["kvstrata bench compare", shlex.join(argv)]).rstrip())
    summary = {"workload": args.workload, "date": stem.split("-", 1)[1], "command": command,
               "machine": machine_info(), "interleaved": args.interleave, "engines": results}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps(portable_tree(summary), indent=2) + "\n")
    probed = any(r.get("throughput") for r in results.values())
    columns = workload.columns + (throughput_columns(args.decode_batch) if probed else ()) + server_columns()
    table = "\n\n".join([markdown_table(results, columns), *ratio_lines(results)])
    (out_dir / f"{stem}.md").write_text(f"`{command}` ({machine_line()})\n\n{table}\n")
    print(table)
    if not args.no_plots:
        for path in workload_plot(workload, results, out_dir, stem):
            print(f"wrote {path}", file=sys.stderr)
    print(f"wrote {out_dir / (stem + '.json')} and {out_dir / (stem + '.md')}", file=sys.stderr)
    failed = any("error" in r or r["errors"] or (r.get("throughput") or {}).get("errors") for r in results.values())
    return 1 if failed else 0

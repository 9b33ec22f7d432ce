"""The Markdown table of a `bench compare` run: one row per engine, the workload's columns, then the
throughput probe's (kvstrata/bench/throughput/probe.py) when it ran.

A `CompareWorkload` is one entry of workloads.py's registry. A `Column` is a header and a function
from one engine's report to its cell; every workload of the registry lists its own. An engine that could not run gets one "not run" row.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, Callable

Report = dict[str, Any]


@dataclass(frozen=True)
class Column:
    header: str
    cell: Callable[[Report], str]


@dataclass(frozen=True)
class CompareWorkload:
    name: str
    add_arguments: Callable[[argparse.ArgumentParser], object]
    run: Callable[[argparse.Namespace, str], Report]  # (args, engine base URL) -> report
    check: Callable[[argparse.Namespace], object]  # raises ValueError naming a bad flag; no I/O
    columns: tuple[Column, ...]
    describe: Callable[[Report], str]  # one engine's report as the standalone command prints it
    plot: str | None = None  # "compare_plots function" drawing {engine: report} into one PNG
    serve_args: dict[str, tuple[str, ...]] = field(default_factory=dict)  # engine -> extra server flags
    needs_tokenizer: bool = True
    probe_after: bool = True  # run the throughput probe after it (unless --no-throughput)


def fmt(x: float | int | None, spec: str) -> str:
    """`spec.format(x)`, or "n/a" for a figure that was not measured."""
    return "n/a" if x is None else spec.format(x)


def seconds(x: float | None) -> str:
    return fmt(x, "{:.2f} s")


def _probe(report: Report) -> dict[str, Any]:
    return report.get("throughput") or {}


def _decode_cell(batch: str) -> Callable[[Report], str]:
    def cell(report: Report) -> str:
        return fmt(_probe(report).get("decode_tokens_per_s", {}).get(batch), "{:.1f}")

    return cell


def throughput_columns(decode_batch: int) -> tuple[Column, ...]:
    """The probe's columns: cold prefill tokens/s and decode tokens/s at batch 1 and `decode_batch`."""
    batches = sorted({1, decode_batch})
    return (
        Column("cold prefill tokens/s", lambda r: fmt(_probe(r).get("prefill_tokens_per_s"), "{:.0f}")),
        *(Column(f"decode tokens/s, batch {b}", _decode_cell(str(b))) for b in batches),
        Column("probe errors", lambda r: str(_probe(r).get("errors", "n/a"))),
    )


def server_columns() -> tuple[Column, ...]:
    """Start-up and memory, for every engine whatever the workload (`meta` of run_engine)."""
    def memory(r: Report) -> str:
        meta = r.get("meta", {})
        if meta.get("rss_mb") is None:
            return "n/a"
        return f"{meta['rss_mb']:,.0f} / {meta['peak_rss_mb']:,.0f}"

    return (
        Column("start to healthy", lambda r: fmt(r.get("meta", {}).get("startup_s"), "{:.0f} s")),
        Column("server RSS after the run / peak, MB", memory),
    )


def markdown_table(results: dict[str, Report], columns: tuple[Column, ...]) -> str:
    lines = ["| engine | " + " | ".join(c.header for c in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for name, report in results.items():
        if "error" in report:
            lines.append(f"| {name} | not run: {report['error']} |" + " |" * (len(columns) - 1))
            continue
        lines.append(f"| {name} | " + " | ".join(c.cell(report) for c in columns) + " |")
    return "\n".join(lines)

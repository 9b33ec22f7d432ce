"""PNG plots of `kvstrata bench trace` (matplotlib, imported only when a plot is drawn).

- `plot_trace(reports, path)`: a replay, one or more engines ({engine: report}): TTFT over the run
  (by send time), TTFT CDF, and the achieved hit rate beside the slice's two ideals.
- `plot_sim(report, path)`: a simulation, the curve of the Mooncake paper's Figure 9: total hit rate
  against L1 capacity (in the trace's tokens) for the L1-only rows, the ideal as a line, and the
  per-tier hit rates of every row as stacked bars.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from kvstrata.bench.plot_base import Reports
from kvstrata.bench.plot_base import pyplot as _pyplot
from kvstrata.bench.plot_base import save as _save


def plot_trace(reports: Reports, path: Path) -> Path:
    plt = _pyplot()
    fig, (ax_t, ax_c, ax_h) = plt.subplots(1, 3, figsize=(15, 4.2))
    names = list(reports)
    for name, r in reports.items():
        rows = [x for x in r["rows"] if x["ttft_s"] is not None and not x["error"]]
        ax_t.scatter([x["sent_s"] for x in rows], [x["ttft_s"] for x in rows], s=8, label=name)
        ttfts = sorted(x["ttft_s"] for x in rows)
        ax_c.plot(ttfts, [(i + 1) / len(ttfts) for i in range(len(ttfts))], label=name)
    ax_t.set(title="TTFT by send time", xlabel="seconds after start", ylabel="TTFT (s)")
    ax_c.set(title="TTFT CDF", xlabel="TTFT (s)", ylabel="fraction of requests")
    for ax in (ax_t, ax_c):
        ax.legend()
    xs = range(len(names))
    ax_h.bar(xs, [reports[n]["hit_rate"] or 0 for n in names], color="tab:blue", label="achieved")
    first = reports[names[0]]
    ax_h.axhline(first["ideal_hit_rate"], color="tab:green", ls="--", label="ideal (trace definition)")
    ax_h.axhline(first["page_ideal_hit_rate"], color="tab:orange", ls=":", label="page ideal")
    ax_h.set_xticks(list(xs), names)
    ax_h.set(title="prefix hit rate (cached / prompt tokens)", ylim=(0, 1))
    ax_h.legend()
    return _save(fig, path)


def plot_sim(report: dict[str, Any], path: Path) -> Path:
    plt = _pyplot()
    meta, results = report["meta"], report["results"]
    scale = meta["trace_block_size"] / meta["block_tokens"]
    fig, (ax_c, ax_b) = plt.subplots(1, 2, figsize=(13, 4.5))
    curve = sorted((r for r in results if not r["l2_tokens"] and r["l1_tokens"] is not None),
                   key=lambda r: r["l1_tokens"])
    if curve:
        ax_c.plot([r["l1_tokens"] * scale / 1e6 for r in curve], [r["hit_rate"] for r in curve], "o-",
                  label="simulated (L1 only)")
        ax_c.set_xscale("log")
    ax_c.axhline(meta["ideal_hit_rate"], color="tab:green", ls="--", label=f"ideal {meta['ideal_hit_rate']:.3f}")
    for x in (3, 50):
        ax_c.axvline(x, color="grey", ls=":", lw=1)
    ax_c.set(title=f"hit rate vs L1 capacity (block {meta['block_tokens']} tokens = 512 in the trace)",
             xlabel="L1 capacity, millions of trace tokens (Mooncake Fig. 9 marks 3M and 50M)", ylabel="hit rate",
             ylim=(0, 1))
    ax_c.legend()
    labels = [r["capacity"] for r in results]
    bottom = [0.0] * len(results)
    for tier, color in (("device", "tab:blue"), ("host", "tab:orange"), ("store", "tab:purple")):
        vals = [r["hit_rate_by_tier"][tier] for r in results]
        ax_b.bar(range(len(results)), vals, bottom=bottom, color=color, label={"device": "L1", "host": "L2",
                                                                               "store": "L3"}[tier])
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax_b.axhline(meta["ideal_hit_rate"], color="tab:green", ls="--")
    ax_b.set_xticks(range(len(results)), labels, rotation=30, ha="right")
    ax_b.set(title="hit rate per tier at each capacity (L1:L2:L3 tokens)", ylim=(0, 1))
    ax_b.legend()
    return _save(fig, path)

"""The PNG plots of a `bench compare` run (matplotlib, optional: `pip install kvstrata[bench]`).

Every function takes the reports of the engines that ran ({engine: report}) and a path, draws one
PNG and returns its path; the registry (workloads.py) names which one a workload draws.
- agentic / multiround: TTFT distribution per engine (first turn or round vs the later ones, box
  plots), hit efficiency per turn or round (cached / achievable tokens), throughput over the run
  (agentic) or TTFT p50 per round (multiround);
- repeat: mean / p50 / p99 latency per engine, all requests and the hot ones;
- throughput (the probe, any workload): cold prefill tokens/s and decode tokens/s per batch size.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from kvstrata.bench.plot_base import Reports
from kvstrata.bench.plot_base import pyplot as _pyplot
from kvstrata.bench.plot_base import save as _save
from kvstrata.bench.report import uncached_prompt_tokens_per_s


def hit_efficiency_per_turn(report: dict[str, Any]) -> dict[int, float | None]:
    cached: dict[int, int] = defaultdict(int)
    achievable: dict[int, int] = defaultdict(int)
    for row in report["per_request"]:
        if row["error"] is None and row["cached_tokens"] is not None:
            cached[row["turn"]] += row["cached_tokens"]
            achievable[row["turn"]] += row["achievable_cached_tokens"]
    return {t: (cached[t] / achievable[t] if achievable[t] else None) for t in sorted(achievable)}


def _ttft_boxes(ax: Any, ok: Reports, first: str) -> None:
    names = list(ok)
    later = [[row["ttft_s"] for row in ok[n]["per_request"] if row["ttft_s"] is not None and row["turn"] > 0]
             for n in names]
    firsts = [[row["ttft_s"] for row in ok[n]["per_request"] if row["ttft_s"] is not None and row["turn"] == 0]
              for n in names]
    pos = range(len(names))
    ax.boxplot(later, positions=[p * 3 for p in pos], widths=0.8, showfliers=True)
    ax.boxplot(firsts, positions=[p * 3 + 1 for p in pos], widths=0.8, showfliers=True)
    ax.set_xticks([p * 3 + 0.5 for p in pos], [f"{n}\nlater | {first}" for n in names])
    ax.set_yscale("log")
    ax.set_ylabel("TTFT (s, log)")
    ax.set_title("TTFT distribution per engine")


def _hit_lines(ax: Any, ok: Reports, unit: str) -> None:
    top = 1.2
    for n, report in ok.items():
        per_turn = hit_efficiency_per_turn(report)
        turns = [t for t, v in per_turn.items() if v is not None]
        ax.plot(turns, [per_turn[t] for t in turns], marker="o", label=n)
        top = max([top, *(per_turn[t] + 0.1 for t in turns)])
    ax.set_xlabel(f"{unit} (0: only the shared system prompt is achievable)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("cached / achievable tokens")
    ax.set_ylim(0, min(top, 3.0))
    ax.set_title(f"Hit efficiency per {unit}")
    ax.legend()


def plot_agentic(ok: Reports, path: Path) -> Path:
    fig, axes = _pyplot().subplots(1, 3, figsize=(15, 4.2))
    _ttft_boxes(axes[0], ok, "first")
    _hit_lines(axes[1], ok, "turn")
    ax, names = axes[2], list(ok)
    pos = range(len(names))
    width = 0.38
    bars = ax.bar([p - width / 2 for p in pos], [ok[n]["output_tokens_per_s"] or 0 for n in names], width,
                  label="output tokens/s")
    ax2 = ax.twinx()
    bars2 = ax2.bar([p + width / 2 for p in pos], [uncached_prompt_tokens_per_s(ok[n]) or 0.0 for n in names], width,
                    color="tab:orange", label="uncached prompt tokens/s")
    ax.set_xticks(list(pos), names)
    ax.set_ylabel("output tokens/s")
    ax2.set_ylabel("uncached prompt tokens/s")
    ax.set_title("Throughput over the run")
    ax.legend(handles=[bars, bars2], loc="upper left", fontsize=8)
    return _save(fig, path)


def plot_multiround(ok: Reports, path: Path) -> Path:
    fig, axes = _pyplot().subplots(1, 3, figsize=(15, 4.2))
    _ttft_boxes(axes[0], ok, "round 0")
    _hit_lines(axes[1], ok, "round")
    ax = axes[2]
    for n, report in ok.items():
        rows = [row for row in report["per_round"] if row["ttft_p50_s"] is not None]
        [line] = ax.plot([row["turn"] for row in rows], [row["ttft_p50_s"] for row in rows], marker="o",
                         label=f"{n} p50")
        rows = [row for row in report["per_round"] if row["ttft_p99_s"] is not None]
        ax.plot([row["turn"] for row in rows], [row["ttft_p99_s"] for row in rows], linestyle="--", alpha=0.6,
                color=line.get_color(), label=f"{n} p99")
    ax.set_xlabel("round")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_yscale("log")
    ax.set_ylabel("TTFT (s, log)")
    ax.set_title("TTFT per round")
    ax.legend(fontsize=8)
    return _save(fig, path)


def _grouped_bars(ax: Any, names: list[str], series: dict[str, list[float]]) -> None:
    width = 0.8 / max(1, len(series))
    for i, (label, values) in enumerate(series.items()):
        xs = [p + (i - (len(series) - 1) / 2) * width for p in range(len(names))]
        bars = ax.bar(xs, values, width, label=label)
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks(list(range(len(names))), names)
    ax.legend(fontsize=8)


def plot_repeat(ok: Reports, path: Path) -> Path:
    fig, axes = _pyplot().subplots(1, 2, figsize=(11, 4.2))
    names = list(ok)
    for ax, section, title in ((axes[0], "all", "All requests"), (axes[1], "hot", "Hot (repeated) requests")):
        keys = ("mean_ms", "p50_ms", "p99_ms")
        series = {k.removesuffix("_ms"): [ok[n][section][k] or 0.0 for n in names] for k in keys}
        _grouped_bars(ax, names, series)
        ax.set_yscale("log")  # a response-cache hit is milliseconds, a miss seconds
        ax.set_ylabel("latency (ms, log)")
        ax.set_title(title)
    return _save(fig, path)


def plot_throughput(ok: Reports, path: Path) -> Path:
    fig, axes = _pyplot().subplots(1, 2, figsize=(11, 4.2))
    names = [n for n, r in ok.items() if r.get("throughput")]
    probes = [ok[n]["throughput"] for n in names]
    _grouped_bars(axes[0], names, {"cold prefill": [p["prefill_tokens_per_s"] or 0.0 for p in probes]})
    axes[0].set_ylabel("tokens/s")
    prompt = [s["prompt_tokens"] for p in probes for s in p["prefill"] if s["prompt_tokens"]]
    size = f"~{sum(prompt) / len(prompt):,.0f}-token" if prompt else "unique"
    axes[0].set_title(f"Cold prefill ({size} unique prompt, TTFT)")
    batches = sorted({b for p in probes for b in p["decode_tokens_per_s"]}, key=int)
    series = {f"batch {b}": [p["decode_tokens_per_s"].get(b) or 0.0 for p in probes] for b in batches}
    _grouped_bars(axes[1], names, series)
    axes[1].set_ylabel("tokens/s (aggregate)")
    axes[1].set_title("Decode, streamed, ignore_eos")
    return _save(fig, path)


def plot_trace(ok: Reports, path: Path) -> Path:
    """The trace workload's plot (kvstrata/bench/trace/plots.py)."""
    from kvstrata.bench.trace.plots import plot_trace as draw

    return draw(ok, path)

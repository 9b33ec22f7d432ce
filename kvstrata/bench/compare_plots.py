"""The Markdown table and PNG plots of a `bench compare` run (matplotlib: `pip install kvstrata[bench]`).

Plots, one PNG each: TTFT distribution per engine (later turns and first turns, box plots), hit
efficiency per turn (cached / achievable tokens of all requests of turn t), throughput (output
tokens/s, and uncached prompt tokens/s over the run).
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any


def _ok(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: r for name, r in results.items() if "error" not in r}


def hit_efficiency_per_turn(report: dict[str, Any]) -> dict[int, float | None]:
    cached: dict[int, int] = defaultdict(int)
    achievable: dict[int, int] = defaultdict(int)
    for row in report["per_request"]:
        if row["error"] is None and row["cached_tokens"] is not None:
            cached[row["turn"]] += row["cached_tokens"]
            achievable[row["turn"]] += row["achievable_cached_tokens"]
    return {t: (cached[t] / achievable[t] if achievable[t] else None) for t in sorted(achievable)}


def prefill_tokens_per_s(report: dict[str, Any]) -> float | None:
    uncached = report["prompt_tokens"] - (report["cached_tokens"] or 0)
    return uncached / report["duration_s"] if report["duration_s"] else None


def markdown_table(results: dict[str, Any]) -> str:
    def f(x: float | None, fmt: str) -> str:
        return "n/a" if x is None else fmt.format(x)

    lines = [
        "| engine | hit efficiency | cached / achievable tokens | TTFT first turn p50 | TTFT later turns p50 / p90 "
        "| e2e p50 | output tokens/s | uncached prompt tokens/s | duration | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        if "error" in r:
            lines.append(f"| {name} | not run: {r['error']} |" + " |" * 8)
            continue
        t1, t2 = r["ttft_s"]["first_turn"], r["ttft_s"]["later_turns"]
        lines.append(
            f"| {name} | {f(r['hit_efficiency'], '{:.3f}')} | {f(r['cached_tokens'], '{:,}')} / "
            f"{r['achievable_cached_tokens']:,} | {f(t1['p50'], '{:.2f} s')} | {f(t2['p50'], '{:.2f} s')} / "
            f"{f(t2['p90'], '{:.2f} s')} | {f(r['e2e_s']['p50'], '{:.2f} s')} | {f(r['output_tokens_per_s'], '{:.1f}')} "
            f"| {f(prefill_tokens_per_s(r), '{:.0f}')} | {r['duration_s']:.0f} s | {r['errors']} |"
        )
    return "\n".join(lines)


def write_plots(results: dict[str, Any], out_dir: Path, stem: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = _ok(results)
    if not ok:
        return []
    names = list(ok)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    later = [[row["ttft_s"] for row in ok[n]["per_request"] if row["ttft_s"] is not None and row["turn"] > 0]
             for n in names]
    first = [[row["ttft_s"] for row in ok[n]["per_request"] if row["ttft_s"] is not None and row["turn"] == 0]
             for n in names]
    pos = range(len(names))
    ax.boxplot(later, positions=[p * 3 for p in pos], widths=0.8, showfliers=True)
    ax.boxplot(first, positions=[p * 3 + 1 for p in pos], widths=0.8, showfliers=True)
    ax.set_xticks([p * 3 + 0.5 for p in pos], [f"{n}\nlater | first" for n in names])
    ax.set_yscale("log")
    ax.set_ylabel("TTFT (s, log)")
    ax.set_title("TTFT distribution per engine")
    ax = axes[1]
    top = 1.2
    for n in names:
        per_turn = hit_efficiency_per_turn(ok[n])
        turns = [t for t, v in per_turn.items() if v is not None]
        ax.plot(turns, [per_turn[t] for t in turns], marker="o", label=n)
        top = max([top, *(per_turn[t] + 0.1 for t in turns)])
    ax.set_xlabel("turn (0: only the shared system prompt is achievable)")
    ax.set_ylabel("cached / achievable tokens")
    ax.set_ylim(0, min(top, 3.0))
    ax.set_title("Hit efficiency per turn")
    ax.legend()
    ax = axes[2]
    width = 0.38
    out_tps = [ok[n]["output_tokens_per_s"] or 0 for n in names]
    pre_tps = [prefill_tokens_per_s(ok[n]) or 0 for n in names]
    bars = ax.bar([p - width / 2 for p in pos], out_tps, width, label="output tokens/s")
    ax2 = ax.twinx()
    bars2 = ax2.bar([p + width / 2 for p in pos], pre_tps, width, color="tab:orange", label="uncached prompt tokens/s")
    ax.set_xticks(list(pos), names)
    ax.set_ylabel("output tokens/s")
    ax2.set_ylabel("uncached prompt tokens/s")
    ax.set_title("Throughput over the run")
    ax.legend(handles=[bars, bars2], loc="upper left", fontsize=8)
    fig.tight_layout()
    path = out_dir / f"{stem}.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return [path]

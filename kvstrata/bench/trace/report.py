"""The report of a trace replay or simulation: JSON-ready dicts and Markdown.

Replay: achieved hit rate = sum(cached_tokens) / sum(prompt_tokens) (the server's usage), beside
two ideals of the same slice, both for a cache that starts empty:
- `ideal_hit_rate`: the trace's definition at this block size, sum(min(m * B, L')) / sum(L'),
  L' = the prompt tokens sent (m = leading ids an earlier request of the slice had);
- `page_ideal_hit_rate`: what a cache of full pages can reach at the server's `--page-size`: a
  prompt's cut last block is never cached and the last prompt token is always computed (sim.py's
  "cut" mode at unbounded capacity, the real radix cache); the server's tails, part pages a finished
  request leaves, can take a replay past it.
Goodput: requests that finished with TTFT <= --slo-ttft-ms and TPOT <= --slo-tpot-ms (a
one-token reply has no TPOT and meets that half), as a fraction and per second of the run.
"""
from __future__ import annotations

from typing import Any, Sequence

from kvstrata.bench.report import percentile
from kvstrata.bench.trace.replay import ReplayRow
from kvstrata.bench.trace.sim import SimResult

Report = dict[str, Any]


def _pcts(values: Sequence[float], qs: Sequence[int] = (50, 90, 99)) -> dict[str, float | None]:
    out: dict[str, float | None] = {f"p{q}": percentile(values, q) for q in qs}
    out["mean"] = sum(values) / len(values) if values else None
    return out


def summarize_replay(
    rows: Sequence[ReplayRow], wall_s: float, ideal: float, page_ideal: float, slo_ttft_ms: float,
    slo_tpot_ms: float, meta: dict[str, Any],
) -> Report:
    ok = [r for r in rows if r.error is None]
    prompt = sum(r.prompt_tokens if r.prompt_tokens is not None else r.prompt_tokens_sent for r in ok)
    cached_known = [r for r in ok if r.cached_tokens is not None]
    cached = sum(r.cached_tokens or 0 for r in cached_known) if cached_known else None
    hit = cached / prompt if cached is not None and prompt else None
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpots = [t for r in ok if (t := r.tpot_s) is not None]
    good = [r for r in ok if r.ttft_s is not None and r.ttft_s * 1000 <= slo_ttft_ms
            and (r.tpot_s is None or r.tpot_s * 1000 <= slo_tpot_ms)]
    out_tokens = sum(r.completion_tokens or 0 for r in ok)
    return {
        "meta": meta,
        "requests": len(rows),
        "errors": len(rows) - len(ok),
        "error_samples": [r.error for r in rows if r.error][:5],
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_rate": hit,
        "ideal_hit_rate": ideal,
        "page_ideal_hit_rate": page_ideal,
        "hit_vs_ideal": hit / ideal if hit is not None and ideal else None,
        "hit_vs_page_ideal": hit / page_ideal if hit is not None and page_ideal else None,
        "ttft_s": _pcts(ttfts),
        "tpot_s": _pcts(tpots),
        "e2e_s": _pcts([r.e2e_s for r in ok if r.e2e_s is not None]),
        "goodput": {
            "slo_ttft_ms": slo_ttft_ms, "slo_tpot_ms": slo_tpot_ms, "good_requests": len(good),
            "fraction": len(good) / len(rows) if rows else None,
            "requests_per_s": len(good) / wall_s if wall_s > 0 else None,
        },
        "duration_s": wall_s,
        "output_tokens_per_s": out_tokens / wall_s if wall_s > 0 else None,
        "rows": [r.to_json() for r in rows],
    }


def _f(x: float | None, spec: str) -> str:
    return "n/a" if x is None else spec.format(x)


def _ms(x: float | None) -> str:
    return _f(None if x is None else x * 1000, "{:,.0f} ms")


def replay_cells(r: Report) -> dict[str, str]:
    """One engine's replay as table cells (the standalone table and `bench compare` share them)."""
    g = r["goodput"]
    return {
        "hit rate (achieved / ideal / page ideal)": f"{_f(r['hit_rate'], '{:.3f}')} / {r['ideal_hit_rate']:.3f} / "
                                                    f"{r['page_ideal_hit_rate']:.3f}",
        "achieved / ideal": _f(r["hit_vs_ideal"], "{:.3f}"),
        "TTFT p50 / p90 / p99": " / ".join(_ms(r["ttft_s"][k]) for k in ("p50", "p90", "p99")),
        "TPOT p50 / p99": " / ".join(_ms(r["tpot_s"][k]) for k in ("p50", "p99")),
        f"goodput (TTFT <= {g['slo_ttft_ms']:g} ms, TPOT <= {g['slo_tpot_ms']:g} ms)":
            f"{g['good_requests']}/{r['requests']} ({_f(g['requests_per_s'], '{:.2f}')} req/s)",
        "duration": _f(r["duration_s"], "{:.0f} s"),
        "errors": str(r["errors"]),
    }


def replay_markdown(r: Report) -> str:
    cells = replay_cells(r)
    lines = ["| " + " | ".join(cells) + " |", "|---" * len(cells) + "|", "| " + " | ".join(cells.values()) + " |"]
    lines += [f"error: {e}" for e in r["error_samples"]]
    return "\n".join(lines)


def sim_report(results: Sequence[SimResult], meta: dict[str, Any]) -> Report:
    return {"meta": meta, "results": [r.to_json() for r in results]}


def sim_markdown(report: Report) -> str:
    meta = report["meta"]
    scale = meta["trace_block_size"] / meta["block_tokens"]
    unit = "trace tokens" if meta["partial_blocks"] == "pad" else "prompt tokens"
    head = ("| L1:L2:L3 (tokens at --block-tokens) | L1 in trace tokens | L1 hit | L2 hit | L3 hit | total hit "
            f"| of ideal | time |\n|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in report["results"]:
        by = r["hit_rate_by_tier"]
        l1 = r["l1_tokens"]
        l1_trace = "inf" if l1 is None else f"{l1 * scale / 1e6:.2f}M"
        lines.append(
            f"| {r['capacity']} | {l1_trace} | {by['device']:.4f} | {by['host']:.4f} | {by['store']:.4f} "
            f"| **{r['hit_rate']:.4f}** | {r['hit_rate'] / meta['ideal_hit_rate']:.3f} | {r['seconds']:.1f} s |"
        )
    return (f"ideal hit rate {meta['ideal_hit_rate']:.4f} ({meta['requests']} requests, {meta['unique_blocks']:,} "
            f"unique blocks = {meta['unique_tokens']:,} tokens at --block-tokens {meta['block_tokens']}); hit rates "
            f"in {unit}\n\n" + "\n".join(lines))

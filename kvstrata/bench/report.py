"""The summary of a bench run: per-request rows, the summary dict (the JSON file), per-turn rows
and the printed table. Achievable cached tokens come from bench/achievable.py.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from kvstrata.bench.achievable import achievable_tokens, sent_sequence

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from kvstrata.bench.client import RequestRecord


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile with linear interpolation (numpy's default); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def build_report(
    records: Sequence[RequestRecord],
    tokenizer: PreTrainedTokenizerBase,
    page_size: int,
    meta: dict[str, Any],
) -> dict[str, Any]:
    records = sorted(records, key=lambda rec: rec.result.t_sent)
    seqs = [sent_sequence(rec, tokenizer) for rec in records]
    achievable = achievable_tokens(seqs, page_size)
    t0 = records[0].result.t_sent if records else 0.0
    rows: list[dict[str, Any]] = []
    for rec, seq, ach in zip(records, seqs, achievable):
        r = rec.result
        output = r.completion_tokens
        if output is None and r.ok:
            output = len(tokenizer.encode(r.text, add_special_tokens=False))
        rows.append({
            "session": rec.session_id, "agent": rec.agent_id, "turn": rec.turn, "kind": rec.turn_kind,
            "prompt_tokens": r.prompt_tokens if r.prompt_tokens is not None else len(seq.prompt_ids),
            "local_prompt_tokens": len(seq.prompt_ids), "server_prompt_tokens": r.prompt_tokens,
            "cached_tokens": r.cached_tokens, "achievable_cached_tokens": ach,
            "output_tokens": output or 0, "finish_reason": r.finish_reason,
            "t_sent_s": r.t_sent - t0, "ttft_s": r.ttft_s, "e2e_s": r.e2e_s, "error": r.error,
        })
    return summarize(rows, meta)


def summarize(rows: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """The summary dict (the JSON file) from per-request rows as built by `build_report`."""
    ok = [row for row in rows if row["error"] is None]
    reported = [row for row in ok if row["cached_tokens"] is not None]
    cached = sum(row["cached_tokens"] for row in reported) if reported else None
    achievable_reported = sum(row["achievable_cached_tokens"] for row in reported)
    t0 = min((row["t_sent_s"] for row in rows), default=0.0)
    duration = max((row["t_sent_s"] + row["e2e_s"] for row in rows), default=0.0) - t0
    output_tokens = sum(row["output_tokens"] for row in ok)

    def ttfts(first: bool) -> dict[str, float | None]:
        xs = [row["ttft_s"] for row in ok if row["ttft_s"] is not None and (row["turn"] == 0) == first]
        return {"mean": sum(xs) / len(xs) if xs else None, **{f"p{q}": percentile(xs, q) for q in (50, 90, 99)}}

    e2e = [row["e2e_s"] for row in ok]
    return {
        "meta": meta,
        "requests": len(rows),
        "errors": len(rows) - len(ok),
        "first_error": next((row["error"] for row in rows if row["error"]), None),
        "prompt_tokens": sum(row["prompt_tokens"] for row in rows),
        "output_tokens": output_tokens,
        "cached_tokens": cached,
        "cached_tokens_reported_requests": len(reported),
        "achievable_cached_tokens": sum(row["achievable_cached_tokens"] for row in rows),
        "hit_efficiency": cached / achievable_reported if cached is not None and achievable_reported else None,
        "prompt_tokens_mismatch": sum(
            row["server_prompt_tokens"] not in (None, row["local_prompt_tokens"]) for row in rows
        ),
        "ttft_s": {"first_turn": ttfts(True), "later_turns": ttfts(False)},
        "e2e_s": {"p50": percentile(e2e, 50), "p99": percentile(e2e, 99)},
        "duration_s": duration,
        "output_tokens_per_s": output_tokens / duration if duration > 0 else None,
        "per_request": rows,
    }


def uncached_prompt_tokens_per_s(report: dict[str, Any]) -> float | None:
    """Prompt tokens the server had to compute (not cached), per second of the run."""
    uncached = report["prompt_tokens"] - (report["cached_tokens"] or 0)
    return uncached / report["duration_s"] if report["duration_s"] else None


def per_turn(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per turn (a multi-round user's round): TTFT p50/p99 and hit efficiency of its requests."""
    turns = sorted({row["turn"] for row in report["per_request"]})
    out = []
    for t in turns:
        rows = [row for row in report["per_request"] if row["turn"] == t]
        ok = [row for row in rows if row["error"] is None]
        ttft = [row["ttft_s"] for row in ok if row["ttft_s"] is not None]
        reported = [row for row in ok if row["cached_tokens"] is not None]
        cached = sum(row["cached_tokens"] for row in reported) if reported else None
        achievable = sum(row["achievable_cached_tokens"] for row in reported)
        out.append({
            "turn": t, "requests": len(rows), "errors": len(rows) - len(ok),
            "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
            "cached_tokens": cached, "achievable_cached_tokens": sum(row["achievable_cached_tokens"] for row in rows),
            "hit_efficiency": cached / achievable if cached is not None and achievable else None,
        })
    return out


def format_table(report: dict[str, Any]) -> str:
    def num(x: float | int | None, scale: float = 1.0, fmt: str = "{:,.0f}") -> str:
        return "n/a" if x is None else fmt.format(x * scale)

    ms = functools.partial(num, scale=1000.0, fmt="{:,.1f}")
    t1, t2 = report["ttft_s"]["first_turn"], report["ttft_s"]["later_turns"]
    lines = [
        ("requests", num(report["requests"])),
        ("errors", num(report["errors"])),
        ("prompt tokens", num(report["prompt_tokens"])),
        ("cached tokens", num(report["cached_tokens"])),
        ("achievable cached tokens", num(report["achievable_cached_tokens"])),
        ("hit efficiency", num(report["hit_efficiency"], fmt="{:.3f}")),
        ("TTFT first turn mean/p50/p90/p99 ms", " / ".join(ms(t1.get(k)) for k in ("mean", "p50", "p90", "p99"))),
        ("TTFT later turns mean/p50/p90/p99 ms", " / ".join(ms(t2.get(k)) for k in ("mean", "p50", "p90", "p99"))),
        ("e2e latency p50/p99 ms", " / ".join(ms(report["e2e_s"][k]) for k in ("p50", "p99"))),
        ("output tokens/s", num(report["output_tokens_per_s"], fmt="{:,.1f}")),
        ("duration s", num(report["duration_s"], fmt="{:,.2f}")),
    ]
    if report["prompt_tokens_mismatch"]:
        lines.append(("prompt token count != server's", num(report["prompt_tokens_mismatch"])))
    if report["first_error"]:
        lines.append(("first error", str(report["first_error"])[:120]))
    width = max(len(k) for k, _ in lines)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in lines)


def write_json(report: dict[str, Any], path: str) -> None:
    """Write a bench report, with the machine it ran on (bench/machine.py) and no absolute path of it
    (bench/paths.py)."""
    from kvstrata.bench.machine import with_machine
    from kvstrata.bench.paths import portable_tree

    Path(path).expanduser().write_text(json.dumps(portable_tree(with_machine(report)), indent=2) + "\n")

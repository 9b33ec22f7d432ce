"""Achievable cached tokens and the summary of a bench run (a printed table and a JSON file).

Achievable cached tokens of a request = the longest prefix of its prompt, in whole pages, that the
server already held when the request was sent, never counting the last prompt token (a server must
recompute it to produce logits). "Held" means tokens of earlier requests the server had computed
KV for, replayed from the client's clock:
- an earlier request's prompt counts from its first content token (its prefill was done then);
- its reply counts from the end of its stream, as `tokenize(reply text)`: the reply sits between
  the assistant header and the end-of-turn token in the next turn's rendered prompt, both token
  boundaries, so these ids are exactly what the next turn re-sends. When the reply was cut by
  `max_tokens` (finish_reason != "stop"), its last token is dropped: the last sampled token is
  never fed through the model, so no server holds its KV. (On "stop" the last sampled token is
  the end-of-turn token, which is not in the text.)
Prompts are rendered with the model's chat template and tokenized locally; `prompt_tokens_mismatch`
counts requests whose local count differs from the server's `usage.prompt_tokens` (a different
template or tokenizer, which makes the achievable figure wrong for that peer).
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from kvstrata.bench.client import RequestRecord


@functools.lru_cache(maxsize=4)
def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """A tokenizer with its chat template from a .gguf file or a Hugging Face folder (cached)."""
    from transformers import AutoTokenizer  # heavy: import only when a report needs it

    p = Path(path).expanduser()
    if p.suffix == ".gguf" and not p.is_file():
        raise FileNotFoundError(
            f"no tokenizer at {p}: pass --tokenizer (a .gguf file or a Hugging Face tokenizer folder)"
            " or fetch the default model with `kvstrata fetch-model smollm2`"
        )
    if p.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
    return AutoTokenizer.from_pretrained(str(p) if p.exists() else path)


def prompt_token_ids(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]) -> list[int]:
    """The ids a server sees: the chat template rendered with the generation prompt, tokenized."""
    if not tokenizer.chat_template:
        raise ValueError("the --tokenizer has no chat template; pass the model's own tokenizer")
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))


class PrefixLedger:
    """Every full page of every sequence added, as a trie keyed by (parent node, page tokens).

    Keys hold the tokens themselves (not a hash of them), so a match can never be a collision.
    """

    def __init__(self, page_size: int) -> None:
        if page_size < 1:
            raise ValueError("--page-size must be >= 1")
        self.page_size = page_size
        self._nodes: dict[tuple[int, tuple[int, ...]], int] = {}

    def add(self, tokens: Sequence[int]) -> None:
        parent = 0
        for start in range(0, len(tokens) - self.page_size + 1, self.page_size):
            key = (parent, tuple(tokens[start : start + self.page_size]))
            parent = self._nodes.setdefault(key, len(self._nodes) + 1)

    def match(self, prompt: Sequence[int]) -> int:
        """Tokens of the longest held page-aligned prefix, leaving out the last token (read-only)."""
        parent, matched = 0, 0
        while matched + self.page_size <= len(prompt) - 1:
            node = self._nodes.get((parent, tuple(prompt[matched : matched + self.page_size])))
            if node is None:
                break
            parent, matched = node, matched + self.page_size
        return matched


@dataclass(frozen=True)
class SentSequence:
    prompt_ids: list[int]
    completion_ids: list[int]  # reply tokens whose KV the server computed
    t_sent: float
    t_prompt_held: float | None  # from when the server held the prompt's KV; None = never
    t_done: float | None  # from when it held prompt + completion; None = failed


def achievable_tokens(sequences: Sequence[SentSequence], page_size: int) -> list[int]:
    """Achievable cached tokens of each sequence (see the module docstring), in input order."""
    events: list[tuple[float, int, int, str]] = []  # (time, order, index, kind)
    for i, s in enumerate(sequences):
        events.append((s.t_sent, 1, i, "send"))
        for t, kind in ((s.t_prompt_held, "prompt"), (s.t_done, "done")):
            if t is not None:  # held before other sends at the same time, never before its own
                events.append((max(t, s.t_sent), 0 if t > s.t_sent else 2, i, kind))
    ledger = PrefixLedger(page_size)
    out = [0] * len(sequences)
    for _, _, i, kind in sorted(events):
        s = sequences[i]
        if kind == "send":
            out[i] = ledger.match(s.prompt_ids)
        elif kind == "prompt":
            ledger.add(s.prompt_ids)
        else:
            ledger.add(s.prompt_ids + s.completion_ids)
    return out


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile with linear interpolation (numpy's default); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def sent_sequence(record: RequestRecord, tokenizer: PreTrainedTokenizerBase) -> SentSequence:
    r = record.result
    completion: list[int] = []
    if r.ok:
        completion = list(tokenizer.encode(r.text, add_special_tokens=False))
        if r.finish_reason != "stop":
            completion = completion[:-1]
    t_prompt = r.t_sent + r.ttft_s if r.ttft_s is not None else (r.t_done if r.ok else None)
    prompt = prompt_token_ids(tokenizer, record.messages)
    return SentSequence(prompt, completion, r.t_sent, t_prompt, r.t_done if r.ok else None)


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

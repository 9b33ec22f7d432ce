"""Draft sources on the edit workload's replies, replayed offline: kvstrata's drafter against arctic-inference's.

Records the greedy replies of the edit workload (`kvstrata bench spec`'s sessions, one agent at a time)
with speculation off, then replays each draft source over them (kvstrata/bench/spec/replay.py): output
tokens per decode step if every drafted token up to the first miss is kept, drafted and accepted tokens,
and the source's own time a step. No timing noise: the same replies for every source.

Sources: `kvstrata-suffix` and `kvstrata-ngram` (the engine's drafter, whole drafts), and `arctic` /
`arctic-d24`: arctic-inference's `SuffixDecodingCache` (the SuffixDecoding paper's implementation, which
vLLM's `{"method": "suffix"}` runs), with its tree 64 deep or 24 (vLLM's default), both at the same cap
of drafted tokens, match factor 1.0 and min probability 0.1. arctic-inference is not a dependency:
build it where you run this (docs/speculative.md says how it built here), or leave it out of --sources.

    PYTHONPATH=. .venv/bin/python bench/draft_replay.py --record /tmp/edit-replies.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvstrata.bench.spec.command import reply_cap
from kvstrata.bench.spec.replay import DraftSource, KvstrataSource, Recorded, replay, summary
from kvstrata.bench.spec.workload import KINDS, EditConfig, generate_edit
from kvstrata.model.fetch import resolve_model
from kvstrata.model.tokenizer import Tokenizer


class ArcticSource:
    """arctic-inference's SuffixDecodingCache, driven as vLLM's suffix proposer drives it."""

    def __init__(self, depth: int, name: str) -> None:
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.name = name
        self.depth = depth
        self.cache = SuffixDecodingCache(max_tree_depth=depth, max_cached_requests=10000)

    def start(self, rid: int, tenant: str, prompt: list[int]) -> None:
        self.cache.start_request(rid, prompt)

    def propose(self, rid: int, context: list[int], k: int) -> list[int]:
        draft = self.cache.speculate(rid, context[-self.depth:], max_spec_tokens=k, max_spec_factor=1.0,
                                     min_token_prob=0.1)
        return list(draft.token_ids)

    def emitted(self, rid: int, tokens: list[int]) -> None:
        self.cache.add_active_response(rid, tokens)

    def finish(self, rid: int) -> None:
        self.cache.stop_request(rid)


def make_source(name: str, k: int, end_ids: tuple[int, ...]) -> DraftSource:
    if name in ("kvstrata-suffix", "kvstrata-ngram"):
        return KvstrataSource(name.split("-")[1], k, end_ids)
    if name == "arctic":
        return ArcticSource(64, name)
    if name == "arctic-d24":
        return ArcticSource(24, name)
    raise ValueError(f"unknown source {name!r}")


def record(model: str, config: EditConfig) -> list[Recorded]:
    """The workload's turns, session by session, greedy, no drafts; one batch (the turns' prompts do not
    depend on the replies: the workload applies each edit itself)."""
    from kvstrata import LLM, SamplingParams

    llm = LLM(model, speculative="off")
    turns = [t for session in generate_edit(config) for t in session]
    prompts = [llm.tokenizer.encode(llm.tokenizer.apply_chat_template(t.messages, add_generation_prompt=True))
               for t in turns]
    outs = llm.generate(prompts, SamplingParams(max_tokens=reply_cap(config), temperature=0.0))
    return [Recorded(t.kind, "", p, o.token_ids) for t, p, o in zip(turns, prompts, outs)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--edit-sessions", type=int, default=6)
    ap.add_argument("--edit-turns", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--k", type=int, default=16, help="most drafted tokens a step (--num-speculative-tokens)")
    ap.add_argument("--sources", default="kvstrata-suffix,kvstrata-ngram,arctic,arctic-d24")
    ap.add_argument("--record", type=Path, help="replies JSON: read if it exists, else recorded and written")
    ap.add_argument("--output", type=Path, help="write the summaries as JSON")
    args = ap.parse_args()
    config = EditConfig(sessions=args.edit_sessions, turns=args.edit_turns, seed=args.seed)
    if args.record and args.record.exists():
        requests = [Recorded(**r) for r in json.loads(args.record.read_text())]
    else:
        requests = record(args.model, config)
        if args.record:
            args.record.write_text(json.dumps([r.__dict__ for r in requests]))
    end_ids = Tokenizer.from_path(resolve_model(args.model)).eos_token_ids
    print(f"{len(requests)} replies, {sum(len(r.output) for r in requests)} tokens; drafts of at most {args.k}")
    print("| source | kind | tokens a decode step | drafted | accepted | acceptance | source time a step, us "
          "| at a request's end, ms per 1k output tokens |")
    print("|---|---|---|---|---|---|---|---|")
    report = {}
    for name in args.sources.split(","):
        try:
            source = make_source(name, args.k, end_ids)
        except ImportError as exc:
            print(f"| {name} | not importable here: {exc} |", file=sys.stderr)
            continue
        rows = replay(source, requests, args.k)
        report[name] = {kind: summary([r for r in rows if r.kind == kind]) for kind in KINDS}
        report[name]["all"] = summary(rows)
        for kind, s in report[name].items():
            print(f"| {name} | {kind} | {s['tokens_per_step']:.2f} | {s['drafted']} | {s['accepted']} | "
                  f"{s['acceptance']:.2f} | {s['us_per_step']:.0f} | {s['finish_ms_per_1k_tokens']:.2f} |")
    if args.output:
        args.output.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

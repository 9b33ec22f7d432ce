"""`kvstrata analyze FILE`: the parser block and the command (the main CLI calls `add_analyze_parser`)."""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path


def add_analyze_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from kvstrata.bench.args import default_tokenizer

    p = subparsers.add_parser(
        "analyze", help="why a request log misses the prefix cache: hit rate, sessions, divergences, advice",
        description="Read a `serve --log-requests` file (or a JSONL of OpenAI chat request bodies), render each "
                    "request through the model's chat template and report where prompts stop sharing a prefix.",
    )
    p.add_argument("file", help="request log (serve --log-requests) or JSONL of chat request bodies")
    p.add_argument("--tokenizer", default=default_tokenizer(),
                   help="the served model: a .gguf file or a HF folder (default: %(default)s)")
    p.add_argument("--chat-template", default=None, help="a Jinja file overriding the tokenizer's chat template")
    p.add_argument("--page-size", type=int, default=16, help="prefix cache page size in tokens (default: %(default)s)")
    p.add_argument("--top", type=int, default=5, help="divergence places to show (default: %(default)s)")
    p.add_argument("--json", default=None, help="also write the analysis as JSON to this file")
    p.set_defaults(func=run_analyze)


def run_analyze(args: argparse.Namespace) -> int:
    from kvstrata.analyze.analysis import analyze, format_analysis
    from kvstrata.analyze.rendered import AnalyzeInputError, load_requests
    from kvstrata.model.tokenizer import Tokenizer

    logging.basicConfig(level=logging.WARNING)
    try:
        bodies = load_requests(args.file)
        tokenizer = Tokenizer.from_path(args.tokenizer)
        if args.chat_template:
            source = Path(args.chat_template).expanduser().read_text(encoding="utf-8")
            tokenizer = Tokenizer(tokenizer.backend, source, tokenizer.special_tokens)
    except (AnalyzeInputError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result = analyze(bodies, tokenizer, page_size=args.page_size, top=args.top)
    print(format_analysis(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result.as_dict(), indent=2) + "\n")
    return 0

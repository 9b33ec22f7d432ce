"""Flags the bench commands share: the client group every workload takes, the agentic workload's, and
`check_ranges`, the bounds check of a workload's flags.

The command modules (agentic, multiround, repeat, compare, ...) and the CLI table (cli.py) import
from here, so no command module imports the CLI that registers it.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from kvstrata.bench.agentic.scan import add_scan_args

DEFAULT_TOKENIZER_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_tokenizer() -> str:
    """The default model's GGUF under $KVSTRATA_HOME (default ~/.cache/kvstrata)."""
    home = Path(os.environ.get("KVSTRATA_HOME") or "~/.cache/kvstrata").expanduser()
    return str(home / DEFAULT_TOKENIZER_FILE)


def add_client_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags every workload shares: where to send, what to call the model, how to report."""
    group = parser.add_argument_group("client")
    group.add_argument("--url", default="http://127.0.0.1:8000",
                       help="base URL of any OpenAI-compatible server (default: %(default)s)")
    group.add_argument("--model", default="smollm2", help="model id sent in requests (default: %(default)s)")
    group.add_argument("--tokenizer", "--model-file", dest="tokenizer", default=default_tokenizer(),
                       help="the served model's tokenizer for token accounting: a .gguf file or a Hugging Face "
                            "folder; for `bench compare` the GGUF every engine serves (default: %(default)s)")
    group.add_argument("--max-tokens", type=int, default=32, help="max_tokens per request (default: %(default)s)")
    group.add_argument("--concurrency", type=int, default=4,
                       help="most requests in flight (default: %(default)s)")
    group.add_argument("--request-rate", type=float, default=None,
                       help="Poisson arrivals per second; overrides --concurrency (default: off)")
    group.add_argument("--seed", type=int, default=0, help="workload and arrival seed (default: %(default)s)")
    group.add_argument("--page-size", type=int, default=16,
                       help="page size in tokens for achievable cached tokens (default: %(default)s)")
    group.add_argument("--output", default=None, help="write the summary as JSON to this file")


def check_client_arguments(args: argparse.Namespace) -> None:
    """Raise ValueError naming a client flag the drivers cannot work with (before any request)."""
    if args.request_rate is not None and args.request_rate <= 0:
        raise ValueError(f"--request-rate (--qps) must be > 0 requests/s (got {args.request_rate})")
    if args.request_rate is None and args.concurrency < 1:
        raise ValueError(f"--concurrency must be >= 1 (got {args.concurrency})")
    if args.page_size < 1:
        raise ValueError(f"--page-size must be >= 1 (got {args.page_size})")


def add_agentic_workload_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The agentic workload's own flags (not --system-tokens, which multiround shares in `compare`)."""
    group = parser.add_argument_group("agentic workload")
    group.add_argument("--sessions", type=int, default=8, help="concurrent agent sessions, 1-64 (default: %(default)s)")
    group.add_argument("--turns", type=int, default=6, help="requests per session, 2-30 (default: %(default)s)")
    group.add_argument("--agents", type=int, default=1,
                       help="distinct system prompts; session s uses agent s %% agents (default: %(default)s)")
    group.add_argument("--turn-tokens", type=int, default=100,
                       help="tokens per user message or tool result, 20-200 (default: %(default)s)")
    add_scan_args(group)  # --scan-prompts, --scan-tokens, --think-time, --cache-hints (agentic/scan.py)
    return group


def check_ranges(checks: list[tuple[str, int, int, int]]) -> None:
    """Raise ValueError naming the first flag whose value is outside [low, high]."""
    for flag, value, low, high in checks:
        if not low <= value <= high:
            raise ValueError(f"{flag} must be in [{low}, {high}] (got {value})")

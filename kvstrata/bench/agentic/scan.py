"""The scan beside `bench agentic`: one-off long prompts while agent sessions think between turns.

    --scan-prompts N    up to N unique prompts of --scan-tokens tokens each, sent back to back (one
                        in flight) from the start until the agent sessions finish; total N * T
                        should exceed the server's L1 + L2 several times (a crawler, a batch job)
    --think-time S      seconds each session waits after a reply before its next turn (a tool call)
    --cache-hints       agent requests send prompt_cache_key (one per session) and
                        prompt_cache_retention "24h"; the scan's requests never do

The scan's requests are not in the report's requests (hit efficiency is the agents'); the report
gets a `scan` section: prompts sent, failed, and prompt tokens the server counted.
"""
from __future__ import annotations

import argparse
import asyncio
import random
from dataclasses import dataclass
from typing import Any

from kvstrata.bench.client import ChatClient
from kvstrata.bench.text import prose


def add_scan_args(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--scan-prompts", type=int, default=0,
                       help="one-off long prompts sent beside the sessions, at most (default: %(default)s: no scan)")
    group.add_argument("--scan-tokens", type=int, default=1600,
                       help="tokens per scan prompt, 100-8000 (default: %(default)s)")
    group.add_argument("--think-time", type=float, default=0.0,
                       help="seconds a session waits between a reply and its next turn (default: %(default)s)")
    group.add_argument("--cache-hints", action="store_true",
                       help="agent requests send prompt_cache_key per session and prompt_cache_retention \"24h\"")


@dataclass(frozen=True)
class ScanConfig:
    prompts: int = 0
    tokens: int = 1600
    think_time: float = 0.0
    cache_hints: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ScanConfig:
        """The scan the flags describe; ValueError naming a bad flag (absent flags: no scan)."""
        cfg = cls(getattr(args, "scan_prompts", 0), getattr(args, "scan_tokens", 1600),
                  getattr(args, "think_time", 0.0), bool(getattr(args, "cache_hints", False)))
        if not 0 <= cfg.prompts <= 10_000:
            raise ValueError(f"--scan-prompts must be in [0, 10000] (got {cfg.prompts})")
        if not 100 <= cfg.tokens <= 8000:
            raise ValueError(f"--scan-tokens must be in [100, 8000] (got {cfg.tokens})")
        if not 0 <= cfg.think_time <= 600:
            raise ValueError(f"--think-time must be in [0, 600] seconds (got {cfg.think_time})")
        return cfg


def session_hints(cfg: ScanConfig, session_id: int, seed: int) -> dict[str, Any]:
    """Extra body fields of a session's requests: none, or its key and the 24h retention."""
    if not cfg.cache_hints:
        return {}
    return {"prompt_cache_key": f"bench-{seed}-session-{session_id}", "prompt_cache_retention": "24h"}


def scan_messages(rng: random.Random, index: int, tokens: int) -> list[dict[str, str]]:
    """A one-off prompt: unique from its first words (no prefix shared with anything but the template)."""
    return [{"role": "user", "content": f"Document {index} {rng.getrandbits(64):x}. Summarise: " + prose(rng, tokens)}]


async def run_scan(client: ChatClient, cfg: ScanConfig, seed: int, done: asyncio.Event) -> dict[str, int]:
    """Send the scan's prompts one at a time until `cfg.prompts` are sent or `done` is set."""
    rng = random.Random(f"kvstrata-scan:{seed}")
    sent = failed = prompt_tokens = 0
    while sent < cfg.prompts and not done.is_set():
        result = await client.chat(scan_messages(rng, sent, cfg.tokens))
        sent += 1
        failed += not result.ok
        prompt_tokens += result.prompt_tokens or 0
    return {"prompts": sent, "failed": failed, "prompt_tokens": prompt_tokens, "tokens_per_prompt": cfg.tokens}

"""A new process's first turn over the `file` L3, offline: what an agent's session costs after a restart.

    .venv/bin/python bench/restore_turn.py --model FILE [--context 12288] [--new 16] [--repeats 2] [--batch-pages N]

Per repeat, in a fresh store folder: a first process prefills one `--context`-token prompt (timed: the cold
prefill) and closes, which flushes its pages to the store; a second process then runs that prompt plus
`--new` fresh tokens for one output token and times it (the restore: L3 -> L2 -> L1, then the new rows).
Each process loads the model as `kvstrata serve` would (32k-token pool, L2 twice the pool); the restored
request's time is split into the prefetch's store reads, its page checks and L2 puts, and the rest
(admission, the copy into L1, the new rows), from timers wrapped around those calls in the second process.
Prints seconds, and the restore as a share of the cold prefill.
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, ".")
from kvstrata.config import CacheConfig  # noqa: E402
from kvstrata.engine.llm import LLM  # noqa: E402
from kvstrata.engine.sampling_params import SamplingParams  # noqa: E402

ONE = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)


def _llm(model: str, store: str, batch_pages: int) -> LLM:
    return LLM(model, max_total_tokens=32768, kvstore_storage_backend="file",
               kvstore_storage_backend_extra_config=json.dumps({"path": store}), kvstore_prefetch_batch_pages=batch_pages)


def _timed(owner: Any, name: str, spent: dict[str, float]) -> None:
    """Wrap owner.name so its calls' wall time adds up in spent[name] (any thread)."""
    inner: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - t

    setattr(owner, name, wrapper)


def phase(args: argparse.Namespace) -> dict[str, float]:
    rng = random.Random(args.seed)
    base = [rng.randrange(100, 49000) for _ in range(args.context)]
    llm = _llm(args.model, args.store, args.batch_pages)
    llm.generate([[rng.randrange(100, 49000) for _ in range(64)]], ONE)  # warm-up, nothing shared with base
    if args.phase == "cold":
        t = time.perf_counter()
        llm.generate([base], ONE)
        out = {"cold_s": time.perf_counter() - t}
        llm.engine.close(drain_timeout_s=120.0)
        return out
    tiers = llm.engine.tiers
    assert tiers is not None and tiers.prefetcher is not None
    spent: dict[str, float] = defaultdict(float)
    _timed(tiers.prefetcher.store, "batch_get", spent)
    _timed(tiers.prefetcher.codec, "decode", spent)
    _timed(tiers.host, "put_bytes", spent)
    _timed(tiers.host, "load_into_pool", spent)
    prompt = base + [rng.randrange(100, 49000) for _ in range(args.new)]
    t = time.perf_counter()
    done = llm.generate([prompt], ONE)[0]
    out = {"restore_s": time.perf_counter() - t, "cached_tokens": float(done.cached_tokens), **spent}
    llm.engine.close(flush=False)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--context", type=int, default=12288)
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-pages", type=int, default=CacheConfig.kvstore_prefetch_batch_pages,
                    help="pages per store read (--kvstore-prefetch-batch-pages; default: %(default)s)")
    ap.add_argument("--phase", choices=["cold", "restore"], help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.phase is not None:
        print(json.dumps(phase(a)))
        return
    for r in range(a.repeats):
        with tempfile.TemporaryDirectory(prefix="kvstrata-restore-") as store:
            got: dict[str, float] = {}
            for name in ("cold", "restore"):
                cmd = [sys.executable, __file__, "--model", a.model, "--context", str(a.context), "--new", str(a.new),
                       "--seed", str(a.seed + r), "--batch-pages", str(a.batch_pages), "--phase", name, "--store", store]
                done = subprocess.run(cmd, capture_output=True, text=True, check=True)
                got.update(json.loads(done.stdout.strip().splitlines()[-1]))
        parts = ", ".join(f"{k} {v:.3f} s" for k, v in got.items() if k not in ("cold_s", "restore_s", "cached_tokens"))
        print(f"repeat {r}: cold {got['cold_s']:.2f} s, restore {got['restore_s']:.3f} s "
              f"({got['restore_s'] / got['cold_s']:.3f}x cold, {int(got['cached_tokens'])} cached); {parts}")


if __name__ == "__main__":
    main()

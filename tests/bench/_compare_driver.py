"""`kvstrata bench compare` with the fake peer process as its only engine: `python THIS PORT OUT_DIR TOKENIZER`.

For tests that interrupt a compare run: the peer it starts must not outlive it.
"""
from __future__ import annotations

import sys
from pathlib import Path

from kvstrata.bench.compare import command as compare
from kvstrata.bench.compare.engines import EngineSpec
from kvstrata.cli import main

FAKE = str(Path(__file__).with_name("_fake_engine_proc.py"))

if __name__ == "__main__":
    port, out_dir, tokenizer = sys.argv[1:4]
    compare.ENGINES = {"fake": EngineSpec("fake", lambda p, gguf: [sys.executable, FAKE, str(p)], "", "", 60.0)}
    sys.exit(main(["bench", "compare", "--engines", "fake", "--model", "ok", "--sessions", "8", "--turns", "30",
                   "--system-tokens", "800", "--turn-tokens", "20", "--max-tokens", "4", "--out-dir", out_dir,
                   "--port", port, "--tokenizer", tokenizer, "--no-plots", "--no-throughput"]))

"""No result, doc or source file records an absolute path of the machine it was made on; `portable`
rewrites the ones a run would record."""
from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

from kvstrata.bench.paths import REPO, portable, portable_tree
from kvstrata.model.fetch import model_home

# an absolute path on a user's machine: the checkout, a home, a temp dir
MACHINE_PATH = re.compile(r"(?<![\w.~$>/:-])/(?:root|home|work|Users|tmp|var/folders|private/var)/")
# documented examples: a command a reader may run (an L3 path or an --out-dir of their choosing)
EXAMPLES = {"docs/kv-tiers.md", "docs/benchmarks.md"}


def tracked(*roots: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", *roots], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return out.split()


def test_no_tracked_result_doc_or_source_holds_a_machine_path() -> None:
    found = []
    for name in tracked("bench/results", "docs", "kvstrata"):
        if name in EXAMPLES:
            continue
        try:
            text = (REPO / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):
            continue  # binary (a plot) or deleted in the working tree
        for n, line in enumerate(text.splitlines(), 1):
            if MACHINE_PATH.search(line):
                found.append(f"{name}:{n}: {line.strip()[:120]}")
    assert not found, "absolute machine paths (use bench/paths.py's forms):\n" + "\n".join(found[:20])


def test_portable_rewrites_the_repo_the_model_home_temp_and_home() -> None:
    tmp = tempfile.gettempdir()
    text = (f"kvstrata bench compare --out-dir {tmp}/runs/x --tokenizer {model_home()}/m.gguf "
            f"log {REPO}/.peers/llama.cpp/bin/llama-server cwd={REPO} {Path.home()}/.pyenv/x.py")
    got = portable(text)
    assert got == ("kvstrata bench compare --out-dir $TMPDIR/runs/x --tokenizer $KVSTRATA_HOME/m.gguf "
                   "log .peers/llama.cpp/bin/llama-server cwd=. ~/.pyenv/x.py")
    assert not MACHINE_PATH.search(got)
    assert portable("http://127.0.0.1:8000/v1 and bench/results/x.json") == "http://127.0.0.1:8000/v1 and bench/results/x.json"
    assert portable_tree({"cmd": [f"{REPO}/a", 3], f"{REPO}/k": None}) == {"cmd": ["a", 3], "k": None}

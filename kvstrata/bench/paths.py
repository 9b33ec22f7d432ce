"""Paths in what a bench run records, made to stand alone on another machine.

A result file keeps the command that made it and the files it read. Written as typed they hold the
machine's own locations (a temp `--out-dir`, the model home's GGUF, the checkout's path in a peer's
log); `portable` rewrites them: the repository's own files relative to it, the model home as
`$KVSTRATA_HOME/`, the temp directory as `$TMPDIR/`, the user's home as `~/`. tests/bench/test_paths.py
keeps every tracked result free of absolute paths.
"""
from __future__ import annotations

import functools
import re
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SYSTEM_TMP = str(Path("/") / "tmp") + "/"  # where $TMPDIR is unset elsewhere


@functools.lru_cache(maxsize=1)
def _rules() -> tuple[tuple[re.Pattern[str], str], ...]:
    """(absolute prefix as a pattern, its stand-in), the most specific first, then the bare checkout; made
    once (a result holds thousands of strings)."""
    from kvstrata.model.fetch import HOME_ENV, model_home

    pairs = [(str(REPO) + "/", ""), (str(model_home()) + "/", f"${HOME_ENV}/"),
             (tempfile.gettempdir().rstrip("/") + "/", "$TMPDIR/"), (SYSTEM_TMP, "$TMPDIR/"),
             (str(Path.home()).rstrip("/") + "/", "~/")]
    seen: set[str] = set()
    out = []
    for prefix, stand_in in sorted(pairs, key=lambda p: -len(p[0])):
        if prefix not in seen and prefix != "/":
            seen.add(prefix)
            out.append((re.compile(r"(?<![\w.~$-])" + re.escape(prefix)), stand_in))
    out.append((re.compile(r"(?<![\w.~$-])" + re.escape(str(REPO)) + r"(?![\w/.-])"), "."))  # the checkout itself
    return tuple(out)


def portable(text: str) -> str:
    """`text` with every absolute path under the repository, model home, temp dir or home rewritten."""
    for pattern, stand_in in _rules():
        text = pattern.sub(lambda _, s=stand_in: s, text)
    return text


def portable_tree(value: Any) -> Any:
    """A JSON-able value with `portable` applied to every string in it (keys too)."""
    if isinstance(value, str):
        return portable(value)
    if isinstance(value, dict):
        return {portable_tree(k): portable_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable_tree(v) for v in value]
    return value

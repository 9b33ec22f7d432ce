"""README.md stays one true page: at most 300 lines, and its `kvstrata serve` flag tables name exactly the
flags `kvstrata serve --help` has (the parser is built from kvstrata/config.py and config_server.py, where
defaults live)."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

from kvstrata.cli import build_parser

README = Path(__file__).resolve().parents[1] / "README.md"
MAX_LINES = 300


def serve_flags() -> set[str]:
    """Every long option of `kvstrata serve`, but the `--no-X` spelling of an on/off `--X` (one row names both)."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    serve = sub.choices["serve"]
    opts = {opt for action in serve._actions for opt in action.option_strings if opt.startswith("--")} - {"--help"}
    return {o for o in opts if not (o.startswith("--no-") and "--" + o[5:] in opts)}


def readme_flags(text: str) -> set[str]:
    """Every `--flag` in the first cell of a table row of the README's serve-flags section."""
    section = text.split("## `kvstrata serve` flags", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `--")]
    return {flag for cell in rows for flag in re.findall(r"`(--[a-z0-9_-]+)[^`]*`", cell)}


def test_the_readme_is_at_most_300_lines() -> None:
    assert len(README.read_text().splitlines()) <= MAX_LINES


def test_the_flag_tables_name_every_serve_flag_and_no_other() -> None:
    ours, real = readme_flags(README.read_text()), serve_flags()
    assert sorted(real - ours) == [], "flags `kvstrata serve --help` has that the README's tables lack"
    assert sorted(ours - real) == [], "flags in the README's tables that `kvstrata serve` does not take"


def test_the_row_reader_finds_each_spelling() -> None:
    text = ("## `kvstrata serve` flags\n| flag | default |\n|---|---|\n| `--a-b` | `1` |\n"
            "| `--on` / `--off` | on |\n| `--file PATH`, `--cache_size` | x |\n## Next\n| `--not-here` | x |\n")
    assert readme_flags(text) == {"--a-b", "--on", "--off", "--file", "--cache_size"}

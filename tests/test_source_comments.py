"""Source comments say what the code does and why: no dated measurement and no particular machine in a
comment or docstring under kvstrata/ (.py, .cpp, .h). Figures, their CPU and their date live in docs/."""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

import kvstrata

ROOT = Path(kvstrata.__file__).parent
# a date (2026-12-05), a CPU model (Zen 3, EPYC, Xeon) or a host of one run ("the VM", "this machine")
LAB_NOTE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b|\bZen ?[1-5]\b|\bEPYC\b|\bXeon\b|\bthe VM\b|\bthis machine\b",
                      re.IGNORECASE)
# files whose comments must name CPU models: path relative to kvstrata/ -> why
ALLOWED = {
    "bench/machine.py": "formats the CPU model /proc/cpuinfo reports; its docstring shows such a line",
}
C_STRING = re.compile(r'"(?:\\.|[^"\\\n])*"')


def python_comments(text: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and every string that stands alone as a statement (docstrings)."""
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(text).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            found += [(node.lineno + i, line) for i, line in enumerate(node.value.value.splitlines())]
    return found


def c_comments(text: str) -> list[tuple[int, str]]:
    """(line, text) of every // and /* */ comment line, string literals skipped."""
    found: list[tuple[int, str]] = []
    in_block = False
    for number, line in enumerate(text.splitlines(), 1):
        code = C_STRING.sub('""', line)
        if in_block:
            end = code.find("*/")
            found.append((number, code if end < 0 else code[:end]))
            in_block = end < 0
            continue
        line_at, block_at = code.find("//"), code.find("/*")
        if line_at >= 0 and (block_at < 0 or line_at < block_at):
            found.append((number, code[line_at:]))
        elif block_at >= 0:
            end = code.find("*/", block_at)
            found.append((number, code[block_at:] if end < 0 else code[block_at:end]))
            in_block = end < 0
    return found


def lab_notes(path: Path, text: str) -> list[str]:
    """`path:line: text` for each comment line of `text` that holds a date or names a machine."""
    comments = python_comments(text) if path.suffix == ".py" else c_comments(text)
    return [f"{path}:{line}: {note.strip()}" for line, note in comments if LAB_NOTE.search(note)]


def sources() -> list[Path]:
    return sorted(p for ext in ("*.py", "*.cpp", "*.h") for p in ROOT.rglob(ext))


def test_no_source_comment_holds_a_date_or_a_machine() -> None:
    notes = [n for p in sources() if p.relative_to(ROOT).as_posix() not in ALLOWED
             for n in lab_notes(p.relative_to(ROOT.parent), p.read_text())]
    assert not notes, "move these figures to docs/ (a comment says what and why):\n" + "\n".join(notes)


def test_every_allowed_file_still_needs_it() -> None:
    for rel in ALLOWED:
        assert lab_notes(ROOT / rel, (ROOT / rel).read_text()), f"{rel} names no machine now: drop it from ALLOWED"


@pytest.mark.parametrize(("name", "text", "line"), [
    ("a.py", "x = 1  # 3 ms on the Zen 3 EPYC\n", 1),
    ("a.py", '"""Fast.\n\nMeasured 2026-12-05."""\n', 3),
    ("a.py", "def f() -> None:\n    \"\"\"Timed on this machine.\"\"\"\n", 2),
    ("a.cpp", "int x;\n// 2.3 ms on the Xeon\n", 2),
    ("a.h", "/* what it does\n   and the VM it ran on */\nint y;\n", 2),
])
def test_a_lab_note_is_found_with_its_line(name: str, text: str, line: int) -> None:
    assert [n.split(": ")[0] for n in lab_notes(Path(name), text)] == [f"{name}:{line}"]


@pytest.mark.parametrize(("name", "text"), [
    ("a.py", 'x = "EPYC"  # the CPU model a detection table matches\n'),
    ("a.py", "def f() -> None:\n    \"\"\"Detects AVX2 and AMX.\"\"\"\n"),
    ("a.cpp", 'const char* m = "Xeon";  // a model name in code, not in the comment\n'),
])
def test_code_and_plain_comments_pass(name: str, text: str) -> None:
    assert lab_notes(Path(name), text) == []

"""docs/architecture.md names every module of the package, so a newcomer finds each file's room there.

The doc names a module by its path under kvstrata/ (`kv/radix_node.py`), or by its file name on a line
that names its package (`pool.py` in the row of `kv/`), or by a pattern there (`*_store.py`). A
package's `__init__.py` counts as named with the package (`kv/`)."""
from __future__ import annotations

import re
from pathlib import Path

import kvstrata

ROOT = Path(kvstrata.__file__).parent
DOC = ROOT.parent / "docs" / "architecture.md"
NAME = re.compile(r"[\w*./-]*\w[\w*./-]*")  # a path-like word: `kv/store/`, `radix.py`, `*_store.py`


def modules() -> list[str]:
    """Every module of the package, as its path under kvstrata/."""
    return sorted(p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.py"))


def named_on(line: str) -> set[str]:
    """The paths a line of the doc names: each word as written, and each module word under each
    package the line names (`quant/` under `model/` gives `model/quant/`)."""
    words = {w.removeprefix("kvstrata/") for w in NAME.findall(line) if w.endswith((".py", "/"))}
    packages = {w for w in words if w.endswith("/")}
    for _ in range(2):  # a subpackage word under a package word names a package too
        packages |= {p + w for p in packages for w in words if w.endswith("/") and not w.startswith(p)}
    return words | {p + w for p in packages for w in words}


def unnamed(doc: str, paths: list[str]) -> list[str]:
    """The module paths the doc does not name."""
    named = set().union(*map(named_on, doc.splitlines()))
    patterns = [re.compile("[^/]*".join(map(re.escape, n.split("*")))) for n in named if "*" in n]  # `*` within a name

    def is_named(path: str) -> bool:
        if path.endswith("__init__.py"):
            package = path.removesuffix("__init__.py")
            return package in named or path in named
        return path in named or any(p.fullmatch(path) for p in patterns)

    return [p for p in paths if not is_named(p)]


def test_the_doc_names_every_module() -> None:
    assert unnamed(DOC.read_text(), modules()) == []


def test_a_module_is_named_by_path_by_name_in_its_package_row_or_by_pattern() -> None:
    doc = "\n".join([
        "| `kv/` | the pool | `pool.py`, `store/` (`guard.py`), `*_tier.py` |",
        "on insert: kv/tiers.py writes through",
        "`radix.py` and `*_store.py` alone name no package",
    ])
    paths = ["kv/__init__.py", "kv/pool.py", "kv/store/guard.py", "kv/host_tier.py", "kv/tiers.py",
             "kv/radix.py", "kv/store/base.py", "kv/store/file_store.py", "model/pool.py", "model/__init__.py"]
    assert unnamed(doc, paths) == [
        "kv/radix.py", "kv/store/base.py", "kv/store/file_store.py", "model/pool.py", "model/__init__.py"]

"""The import graph, read from the source (every import, lazy and TYPE_CHECKING ones included): no
module imports itself through others, and a package imports only from those before it in docs/architecture.md's list."""
from __future__ import annotations

import ast
from pathlib import Path

import kvstrata

ROOT = Path(kvstrata.__file__).parent
ORDER = ["config", "config_server", "config_flags", "process_tree", "model", "kv", "engine", "metrics", "serving", "router", "bench", "analyze"]  # docs/architecture.md
TOP = {"__init__", "cli"}  # the package's front door and the main CLI may import anything


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}

    def resolve(name: str) -> str | None:  # "a.b.C" -> the module "a.b" that defines C
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            graph[name].update(t for t in map(resolve, targets) if t and t != name)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles() -> None:
    assert circles(import_graph()) == []


def test_the_circle_finder_finds_one() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_packages_import_only_those_before_them() -> None:
    wrong = []
    for name, targets in import_graph().items():
        package = name.split(".")[1] if "." in name else "__init__"
        if package in TOP:
            continue
        for target in targets:
            other = target.split(".")[1] if "." in target else "__init__"
            if other not in TOP and other != package and ORDER.index(other) > ORDER.index(package):
                wrong.append(f"{name} -> {target}")
            if other in TOP and not (package == "bench" and other == "__init__"):  # bench drives the offline LLM
                wrong.append(f"{name} -> {target}")
    assert wrong == []

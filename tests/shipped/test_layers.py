"""The package's import graph, parsed from the source: no cycle, and every import points down the layers."""

from __future__ import annotations

import ast
from pathlib import Path

from support.paths import ROOT

PACKAGE = ROOT / "exporter" / "stallwatch"


# Bottom to top, as in docs/architecture.md; a module may import its own layer's modules and those below it.
LAYERS = (
    ("stallwatch", "stallwatch.text", "stallwatch.procfs", "stallwatch.loops", "stallwatch.stable_names"),
    ("stallwatch.engines",),
    ("stallwatch.config",),
    ("stallwatch.logs",),
    ("stallwatch.discovery",),
    ("stallwatch.signals",),
    ("stallwatch.runtime",),
    ("stallwatch.collectors",),
    ("stallwatch.report",),
    ("stallwatch.web",),
    ("stallwatch.app",),
    ("stallwatch.cli", "stallwatch.__main__"),
)


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that `name` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, one level up per extra dot
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}  # `from pkg import module`
    return {module for module in found if module in known and module != name}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def layer(module: str) -> int:
    for index, members in reversed(list(enumerate(LAYERS))):
        if any(module == m or module.startswith(m + ".") for m in members if m != "stallwatch"):
            return index
    assert module in LAYERS[0], f"{module} is in no layer: add it to LAYERS and docs/architecture.md"
    return 0


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return out


def test_the_import_graph_has_no_cycle() -> None:
    assert cycles(graph()) == []


def test_imports_point_down_the_layers() -> None:
    upward = sorted(f"{a} -> {b}" for a, targets in graph().items() for b in targets if layer(b) > layer(a))
    assert upward == []


def test_the_checks_see_function_level_imports_and_cycles(tmp_path: Path) -> None:
    """The parser finds an import inside a function, and a two-module cycle is reported."""
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from stallwatch.cli import main\n")
    assert imports("stallwatch.text", source, {"stallwatch.cli": source}) == {"stallwatch.cli"}
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]


def test_the_layers_are_the_ones_documented() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    for members in LAYERS:
        for module in members:
            if module != "stallwatch":
                assert f"`{module.removeprefix('stallwatch.')}" in doc, module

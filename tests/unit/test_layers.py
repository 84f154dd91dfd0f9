"""Layers only look down: the package's import graph (module-level and function-level imports alike) has no
cycle, the library never imports the CLI, and the simulator never imports the chooser or the tuner."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "collectives"
ALGORITHMS = ROOT / "algorithms"  # installed as collectives.algorithms


def module_name(path: Path) -> str:
    if path.is_relative_to(ALGORITHMS):
        parts = ("collectives", "algorithms", *path.relative_to(ALGORITHMS).with_suffix("").parts)
    else:
        parts = ("collectives", *path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in [*PACKAGE.rglob("*.py"), *ALGORITHMS.rglob("*.py")]}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules `name` imports anywhere in its file (resolved to the deepest known module)."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()

    def add(target: str) -> None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("collectives"):
                    add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name if is_package else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            if not mod.startswith("collectives"):
                continue
            for alias in node.names:
                full = f"{mod}.{alias.name}"
                add(full if full in known else mod)
    return out


@functools.cache  # parsed once for the four checks (read-only)
def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    g = {name: imports(name, path, known) for name, path in mods.items()}
    # a package imports its parent packages' __init__ implicitly; that is not an edge of our design
    return g


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each as a list."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def _is_parent_package(a: str, b: str) -> bool:
    return b.startswith(a + ".") or a.startswith(b + ".")


def test_no_import_cycles():
    g = graph()
    # a package's __init__ re-exporting its submodules is not a layer going up: leave parent-child edges out
    pruned = {a: {b for b in deps if not _is_parent_package(a, b)} for a, deps in g.items()}
    found = cycles(pruned)
    assert not found, "import cycles (function-level imports count):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_library_never_imports_the_cli():
    g = graph()
    bad = sorted(f"{a} imports {b}" for a, deps in g.items() if not a.startswith("collectives.cli")
                 for b in deps if b.startswith("collectives.cli"))
    assert not bad, "\n".join(bad)


def test_the_simulator_never_imports_the_chooser_or_the_tuner():
    g = graph()
    engine = [m for m in g if m.startswith(("collectives.simulate.", "collectives.simulator"))]
    bad = sorted(f"{a} imports {b}" for a in engine for b in g[a]
                 if b in ("collectives.tune", "collectives.choice", "collectives.transport"))
    assert not bad, "\n".join(bad)


def test_the_graph_sees_function_level_imports():
    g = graph()
    # collectives.transport.communicator imports plans at module level; the walker must see imports inside
    # functions too (this one is inside a function of collectives.decisions)
    assert "collectives.units" in g["collectives.decisions"]

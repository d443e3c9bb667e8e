"""The import graph of src/spectool: no circle, recipes (commands/, cli) import the library and
never the reverse, nothing below rl/ imports it (train-rl's settings and trainer), and runs.py is
a leaf (errors and the version only)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src" / "spectool"
RECIPES = ("spectool.commands", "spectool.cli")


def _graph() -> dict[str, set[str]]:
    """module -> spectool modules it imports anywhere (module level or inside functions); the
    package root (its lazy public names) is left out: every module is imported through it."""
    mods = {("spectool." + ".".join(f.relative_to(ROOT).with_suffix("").parts)).removesuffix(".__init__"): f
            for f in ROOT.rglob("*.py")}
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("spectool"):
                for a in node.names:
                    t = f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module
                    if t in mods and t not in (m, "spectool"):
                        edges[m].add(t)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
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

    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_and_no_arrow_up_to_the_recipes():
    edges = _graph()
    assert _cycles(edges) == []
    up = sorted((m, t) for m, ts in edges.items() for t in ts if t.startswith(RECIPES) and not m.startswith(RECIPES))
    assert up == []
    into_rl = sorted((m, t) for m, ts in edges.items() for t in ts
                     if t.startswith("spectool.rl") and not m.startswith((*RECIPES, "spectool.rl")))
    assert into_rl == []
    assert edges["spectool.runs"] <= {"spectool.errors"}


def test_the_check_sees_a_circle():
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]

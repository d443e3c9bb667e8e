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
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):  # imports under `if TYPE_CHECKING:` never run: not an arrow
            if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
                node.body = []
        for node in ast.walk(tree):
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
    assert edges["spectool.runs"] <= {"spectool.errors", "spectool.version"}


def test_the_check_sees_a_circle():
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]


REPO = Path(__file__).resolve().parents[1]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    import re

    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(md: Path) -> set[str]:
    return {_slug(line.lstrip("#")) for line in md.read_text().splitlines() if line.startswith("#")}


def _links(md: Path) -> list[str]:
    import re

    text = md.read_text()
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks hold no links
    return [m for m in re.findall(r"\]\(([^)\s]+)\)", text) if not m.startswith(("http://", "https://", "mailto:"))]


def test_the_readme_is_short_and_links_every_docs_page():
    readme = REPO / "README.md"
    assert len(readme.read_text().splitlines()) <= 150
    linked = {(readme.parent / link.split("#")[0]).resolve() for link in _links(readme)}
    pages = set((REPO / "docs").glob("*.md"))
    assert pages and {p.resolve() for p in pages} <= linked, sorted(p.name for p in pages if p.resolve() not in linked)


def test_every_relative_link_and_anchor_in_the_docs_resolves():
    broken = []
    for md in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for link in _links(md):
            path, _, anchor = link.partition("#")
            target = (md.parent / path).resolve() if path else md
            if not target.exists():
                broken.append(f"{md.name}: {link} (no such file)")
            elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
                broken.append(f"{md.name}: {link} (no such heading)")
    assert not broken, broken


def test_the_link_check_sees_a_broken_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# Top\n## Draft quality: the `quality` preset\n")
    assert "draft-quality-the-quality-preset" in _anchors(tmp_path / "a.md")
    assert "draft-quality" not in _anchors(tmp_path / "a.md")


# the commands' settings (config/, a module each); the harvest stage's, HarvestConfig, lives with the stage
# (harvesting.py), which init-draft runs too; the settings groups they are made of are settings/
COMMAND_SETTINGS = {"InitDraftConfig", "ExportConfig", "RolloutConfig", "SweepConfig", "VerifyConfig", "ForecastConfig"}


def _imported_names(f: Path) -> list[tuple[str, str]]:
    """(module, name) of every `from X import name` in a file, at any depth."""
    return [(node.module or "", a.name) for node in ast.walk(ast.parse(f.read_text()))
            if isinstance(node, ast.ImportFrom) for a in node.names]


def test_no_library_module_imports_a_commands_settings():
    offenders = []
    for f in ROOT.rglob("*.py"):
        rel = f.relative_to(ROOT)
        if rel.parts[0] in ("commands", "config") or rel.name == "cli.py":
            continue
        offenders += [f"{rel}: {name}" for mod, name in _imported_names(f) if mod.startswith("spectool.config")
                      and name in COMMAND_SETTINGS]
    assert not offenders, offenders


def test_the_settings_are_short_torch_free_modules_on_the_ground_floors():
    """Every settings module (the groups, settings/; each command's, config/; rl.yaml's, rl/config.py) is under 300
    lines and imports no torch, vLLM or transformers, and the groups import nothing but the ground floor (constants,
    errors, prompts, trackers) and each other: the library reads them, never the other way up."""
    ground = ("spectool.constants", "spectool.errors", "spectool.prompts", "spectool.trackers", "spectool.settings")
    files = [*(ROOT / "settings").glob("*.py"), *(ROOT / "config").glob("*.py"), ROOT / "rl" / "config.py"]
    assert len(files) >= 12
    for f in files:
        lines = len(f.read_text().splitlines())
        assert lines <= 300, f"{f.relative_to(ROOT)}: {lines} lines"
        modules = {node.module or "" for node in ast.walk(ast.parse(f.read_text())) if isinstance(node, ast.ImportFrom)}
        modules |= {a.name for node in ast.walk(ast.parse(f.read_text())) if isinstance(node, ast.Import) for a in node.names}
        assert not {m for m in modules if m.split(".")[0] in ("torch", "vllm", "transformers")}, f
        if f.parent.name == "settings":
            assert {m for m in modules if m.startswith("spectool")} <= {m for m in modules if m.startswith(ground)}, f


def test_tests_import_no_private_name_from_the_commands():
    offenders = [f"{f.name}: {mod}.{name}" for f in (REPO / "tests").glob("*.py") for mod, name in _imported_names(f)
                 if mod.startswith("spectool.commands") and name.startswith("_")]
    assert not offenders, offenders


def test_the_facts_every_floor_reads_import_nothing_above_them():
    """The constants, the settings, the families table, the position ranges, the context and memory plans and the
    engine area are read by draft/, rl/, the commands and the integrations; none of them imports one of those (an
    import up a floor: issue 67 moved the families table and the position range down for it)."""
    above = ("spectool.draft", "spectool.commands", "spectool.config", "spectool.rl", "spectool.integrations",
             "spectool.cli", "spectool.harvesting")
    files = [ROOT / name for name in ("constants.py", "context.py", "memory.py", "families.py", "positions.py")]
    files += [*(ROOT / "engine").glob("*.py"), *(ROOT / "settings").glob("*.py")]
    offenders = [f"{f.relative_to(ROOT)}: {mod}" for f in files for mod, _ in _imported_names(f) if mod.startswith(above)]
    offenders += [f"{f.relative_to(ROOT)}: {a.name}" for f in files for node in ast.walk(ast.parse(f.read_text()))
                  if isinstance(node, ast.Import) for a in node.names if a.name.startswith(above)]
    assert len(files) > 20 and not offenders, offenders

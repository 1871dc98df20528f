"""The package's shape (docs/architecture.md): small modules, short functions, and imports that
flow one way, from the commands down to the config. These fail when a module or function grows
past the limit, or when a lower layer starts importing a higher one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGE = ROOT / "accel"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
# Lower layers never import higher ones (lazy imports inside functions included).
LAYERS = {
    "accel": 0,  # the package's __init__: a version string
    "accel.uris": 0, "accel.errors": 0, "accel.console": 0, "accel.signals": 0, "accel.nets": 0,
    "accel.foreground": 0, "accel.usage": 0,
    "accel.config": 1, "accel.config_checks": 1, "accel.config_params": 1,
    "accel.config_types": 1, "accel.ranks": 1,
    "accel.data": 2, "accel.models": 2, "accel.engine": 2, "accel.tracking": 2,
    "accel.shared_data": 2, "accel.resident": 2, "accel.schedule": 2,
    "accel.train": 3,
    "accel.tune": 4, "accel.reproduce": 4, "accel.resume": 4, "accel.ablation": 4,
    "accel.registry": 4, "accel.evaluate": 4, "accel.verify": 4,
    "accel.cli": 5, "accel.__main__": 5,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer(name: str) -> int:
    for prefix, level in sorted(LAYERS.items(), key=lambda kv: -len(kv[0])):
        if name == prefix or name.startswith(prefix + "."):
            return level
    raise AssertionError(f"{name} has no layer in tests/test_layout.py: add it to LAYERS")


def imported(name: str) -> set[str]:
    """The accel modules `name` imports, anywhere in the file."""
    tree = ast.parse(MODULES[name].read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in out if m in MODULES and m not in (name, "accel")}


@pytest.mark.parametrize("name", MODULES)
def test_module_is_short(name):
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{name}: {lines} lines; split it by concern"


@pytest.mark.parametrize("name", MODULES)
def test_functions_read_as_recipes(name):
    tree = ast.parse(MODULES[name].read_text())
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{name}: {', '.join(long)}"


@pytest.mark.parametrize("name", MODULES)
def test_imports_flow_down(name):
    upward = sorted(m for m in imported(name) if layer(m) > layer(name))
    assert not upward, f"{name} (layer {layer(name)}) imports higher layers: {upward}"


def test_no_import_cycles():
    graph = {name: imported(name) - {name} for name in MODULES}
    # A package's __init__ re-exports its modules: an edge from it to them is not a cycle.
    graph = {n: {m for m in deps if not m.startswith(n + ".")} for n, deps in graph.items()}
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*path, node, dep]))
            if dep not in state:
                visit(dep, [*path, node])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])


@pytest.mark.parametrize("path", sorted((ROOT / "bench").glob("*.py")), ids=lambda p: p.stem)
def test_bench_scripts_import_what_exists(path):
    """Benchmarks import accel lazily inside main(): check every accel name they import."""
    import importlib
    import importlib.util

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("accel"):
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name) or importlib.util.find_spec(
                    f"{node.module}.{alias.name}"), f"{path.name}: {node.module}.{alias.name}"

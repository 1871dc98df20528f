"""The package's shape (docs/architecture.md): small modules, short functions, and imports that
flow one way, from the commands down to the config. These fail when a module or function grows
past the limit, or when a lower layer starts importing a higher one. The outbuildings (bench/,
checks/) keep the same size limits, import accel but never each other, and no module anywhere
in the three imports itself back round a circle."""

from __future__ import annotations

import ast
import re
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
    "accel.foreground": 0, "accel.usage": 0, "accel.timing": 0, "accel.flops": 0,
    "accel.config": 1, "accel.config_checks": 1, "accel.config_params": 1,
    "accel.config_types": 1, "accel.ranks": 1,
    "accel.data": 2, "accel.models": 2, "accel.engine": 2, "accel.tracking": 2,
    "accel.shared_data": 2, "accel.resident": 2, "accel.schedule": 2, "accel.muon": 2,
    "accel.param_groups": 2, "accel.decoded": 2,
    "accel.train": 3,
    "accel.tune": 4, "accel.reproduce": 4, "accel.resume": 4, "accel.ablation": 4,
    "accel.registry": 4, "accel.evaluate": 4, "accel.verify": 4, "accel.report": 4,
    "accel.cli": 5, "accel.__main__": 5,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
# The benchmarks and the system checks: read and changed as often as the package.
OUTBUILDINGS = {module_name(p): p for top in ("bench", "checks")
                for p in sorted((ROOT / top).rglob("*.py"))}
EVERY_MODULE = {**MODULES, **OUTBUILDINGS}
TOPS = {name.split(".")[0] for name in EVERY_MODULE}


def layer(name: str) -> int:
    for prefix, level in sorted(LAYERS.items(), key=lambda kv: -len(kv[0])):
        if name == prefix or name.startswith(prefix + "."):
            return level
    raise AssertionError(f"{name} has no layer in tests/test_layout.py: add it to LAYERS")


def imported(name: str, modules: dict[str, Path] = MODULES, *,
             types_too: bool = True) -> set[str]:
    """The modules of `modules` that `name` imports, anywhere in the file; without
    `types_too`, not those imported for type annotations alone (`if TYPE_CHECKING:`)."""
    tree = ast.parse(EVERY_MODULE[name].read_text())
    if not types_too:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
                node.body = []
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in out if m in modules and m != name and m not in TOPS}


@pytest.mark.parametrize("name", EVERY_MODULE)
def test_module_is_short(name):
    lines = len(EVERY_MODULE[name].read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{name}: {lines} lines; split it by concern"


@pytest.mark.parametrize("name", EVERY_MODULE)
def test_functions_read_as_recipes(name):
    tree = ast.parse(EVERY_MODULE[name].read_text())
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{name}: {', '.join(long)}"


@pytest.mark.parametrize("name", MODULES)
def test_imports_flow_down(name):
    upward = sorted(m for m in imported(name) if layer(m) > layer(name))
    assert not upward, f"{name} (layer {layer(name)}) imports higher layers: {upward}"


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    # Imports for annotations count: a module whose types need another's that imports it back
    # cannot be read or moved alone (accel/train/view.py shows the way out).
    graph = {name: imported(name, modules, types_too=True) for name in modules}
    # A package's __init__ re-exports its modules: an edge from it to them is not a cycle.
    return {n: {m for m in deps if not m.startswith(n + ".")} for n, deps in graph.items()}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (its modules in order, the first repeated), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return [*path, node, dep]
            if dep not in state and (found := visit(dep, [*path, node])):
                return found
        state[node] = 2
        return None

    for name in sorted(graph):
        if name not in state and (found := visit(name, [])):
            return found
    return None


def test_no_import_cycles_in_accel_bench_or_checks():
    found = cycle(import_graph(EVERY_MODULE))
    assert found is None, "import cycle: " + " -> ".join(found or [])


def unit(name: str) -> str:
    """The package (or top-level module) a module belongs to: accel.tune, accel.cli, checks.gpu."""
    return ".".join(name.split(".")[:2])


def test_no_package_imports_another_back():
    """Between packages, lazy imports count: accel.tune's end calling accel.report, which reads
    accel.tune, is a circle even when no module-level cycle closes (the CLI hands the page
    writer down instead)."""
    graph: dict[str, set[str]] = {}
    for name in EVERY_MODULE:
        deps = {unit(m) for m in imported(name, EVERY_MODULE, types_too=False)} - {unit(name)}
        graph.setdefault(unit(name), set()).update(deps)
    graph = {n: {m for m in deps if m in graph} for n, deps in graph.items()}
    found = cycle(graph)
    assert found is None, "packages import each other: " + " -> ".join(found or [])


def test_the_cycle_check_finds_a_cycle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def may_import(name: str) -> set[str]:
    """Where `name`'s imports may go: accel stays within itself; a benchmark imports accel and
    bench/; checks.common imports accel only; a check's package imports accel, checks.common and
    itself: no other check, nothing of bench/ (docs/architecture.md, "Outbuildings")."""
    parts = name.split(".")
    if parts[0] != "checks" or len(parts) == 1:
        return {"accel", parts[0]}
    if parts[1] == "common":
        return {"accel", "checks.common"}
    return {"accel", "checks.common", f"checks.{parts[1]}"}


def owner(name: str) -> str:
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "checks" and len(parts) > 1 else parts[0]


@pytest.mark.parametrize("name", EVERY_MODULE)
def test_bench_and_checks_import_accel_never_each_other(name):
    allowed = may_import(name)
    wrong = sorted(m for m in imported(name, EVERY_MODULE)
                   if owner(m) not in allowed and m.split(".")[0] not in allowed)
    assert not wrong, f"{name} imports {wrong}; it may import {sorted(allowed)}"


@pytest.mark.parametrize("path", sorted(OUTBUILDINGS.values()),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_bench_and_checks_import_what_exists(path):
    """Benchmarks and checks import accel lazily inside functions: check every accel name."""
    import importlib
    import importlib.util

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("accel"):
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name) or importlib.util.find_spec(
                    f"{node.module}.{alias.name}"), f"{path.name}: {node.module}.{alias.name}"


# Where the docs, the Makefile, the experiments and the code name a benchmark or a check.
REFERRING = [ROOT / "README.md", ROOT / "Makefile", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "experiments").rglob("*.yaml")), *sorted((ROOT / "docker").glob("*")),
             *(p for top in ("accel", "bench", "checks", "tests")
               for p in sorted((ROOT / top).rglob("*.py")))]
PATH_REF = re.compile(r"(?<![\w./-])((?:bench|checks)/[\w/.-]*\w)")
MODULE_REF = re.compile(r"python3? -m ((?:bench|checks)(?:\.\w+)+)")


def named_outbuildings(text: str) -> set[str]:
    """The bench/ and checks/ paths a text names; a module it runs (`python -m checks.gpu`) as
    its path without the .py."""
    paths = set(PATH_REF.findall(text))
    return paths | {m.replace(".", "/") for m in MODULE_REF.findall(text)}


def exists(ref: str) -> bool:
    path = ROOT / ref
    return path.exists() or path.with_name(path.name + ".py").exists()


def test_the_reference_check_reads_paths_and_modules():
    text = "`bench/cpu_step.py`, (checks/gpu/plan.py), python -m checks.chaos --seconds 3 bench/"
    assert named_outbuildings(text) == {"bench/cpu_step.py", "checks/gpu/plan.py", "checks/chaos"}
    assert exists("checks/chaos") and exists("checks/gpu/peer_airbench")
    assert not exists("bench" + "/gone.py")


def test_every_named_benchmark_and_check_exists():
    """A benchmark or check moved or renamed leaves no doc, Makefile line or comment behind."""
    missing = [f"{page.relative_to(ROOT)}: {ref}" for page in REFERRING if page.is_file()
               for ref in sorted(named_outbuildings(page.read_text(errors="replace")))
               if not exists(ref)]
    assert not missing, "named but absent:\n" + "\n".join(missing)

"""A run's order of events is the code's and the page's alike: `accel.train.run.Run` takes its
steps in the order docs/architecture.md#a-runs-order lists them, registers every handler of the
trainer in one place, and keeps no state that outlives a run but what is named here."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap

from accel.train.run import Run
from tests.conftest import ROOT

HANDLERS = {"after_update": "After every optimizer update",
            "start_epoch": "At every epoch's start",
            "end_epoch": "At every epoch's end"}


def steps_in_code(method: str) -> list[str]:
    """The `self.<step>(...)` calls of Run.<method>, in order."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(Run, method))))
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute)
             and isinstance(node.func.value, ast.Name) and node.func.value.id == "self"]
    return [c.func.attr for c in sorted(calls, key=lambda c: (c.lineno, c.col_offset))]


def steps_on_page(heading: str) -> list[str]:
    page = (ROOT / "docs" / "architecture.md").read_text()
    block = page[page.index(heading):].split("\n\n")[0]
    return re.findall(r"^\d+\. `(\w+)`", block, flags=re.M)


def test_the_pages_order_is_the_codes():
    for method, heading in HANDLERS.items():
        assert steps_in_code(method) == steps_on_page(heading), method


def test_every_handler_is_registered_by_the_run_alone():
    """Outside accel/train/run.py no module of accel registers a handler on an engine (Ignite's
    metrics and progress bar register their own)."""
    registering = re.compile(r"add_event_handler|\.on\(")
    found = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "accel").rglob("*.py"))
             if p.name != "run.py" for i, line in enumerate(p.read_text().splitlines(), 1)
             if registering.search(line)]
    assert found == []


def test_run_fields_are_typed():
    annotations = inspect.get_annotations(Run)
    assert annotations and not [k for k, v in annotations.items() if "Any" in str(v)]


# Process-wide mutable state in accel/train/, each with its reason: glibc's allocator settings
# are the process's (memory._kept says whether they are changed); a study's trials run in one
# process and say a notice about the data once, not once per trial (parts._said).
PROCESS_WIDE = {"accel/train/memory.py": {"_kept"}, "accel/train/parts.py": {"_said"}}


def test_no_process_wide_state_in_train_but_what_is_named():
    """Module-level names bound to mutable values (UPPER_CASE constants aside) or rebound
    with `global`."""
    for path in sorted((ROOT / "accel" / "train").glob("*.py")):
        tree = ast.parse(path.read_text())
        found = {name for node in ast.walk(tree) if isinstance(node, ast.Global)
                 for name in node.names}
        for node in tree.body:
            if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(
                    node.value, ast.List | ast.Dict | ast.Set | ast.Call):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found |= {t.id for t in targets if isinstance(t, ast.Name)
                          and not t.id.isupper() and t.id != "__all__"}  # constants aside
        name = str(path.relative_to(ROOT))
        assert found == PROCESS_WIDE.get(name, set()), name

"""The stages' import rules (docs/architecture.md), checked on the source so that a shortcut across
stages fails here instead of drifting in unnoticed."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "applier"

#: stage -> the applier packages/modules it must never import
FORBIDDEN = {
    "protocol": ("sources", "assembly", "sink", "catalog", "values", "loop", "drivers", "commands", "checks"),
    "catalog": ("sources", "assembly", "sink", "values", "loop", "drivers", "commands", "checks"),
    "values": ("sources", "assembly", "sink", "loop", "drivers", "commands", "checks"),
    "assembly": ("sources", "sink", "loop", "drivers", "commands", "checks"),
    "sink": ("sources", "assembly", "loop", "drivers", "commands", "checks"),
    "sources": ("assembly", "sink", "loop", "drivers", "commands", "checks"),
    "changes": ("sources", "assembly", "sink", "loop", "drivers"),
    "loop": ("drivers", "commands", "checks", "sources"),
}


def _imports(path: Path) -> set[str]:
    """applier modules imported anywhere in the file (module level, functions, TYPE_CHECKING)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("applier"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("applier")}
    return found


def _stage(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_go_one_way(path: Path) -> None:
    stage = _stage(path)
    wrong = sorted(m for m in _imports(path)
                   for bad in FORBIDDEN.get(stage, ()) if m == f"applier.{bad}" or m.startswith(f"applier.{bad}."))
    assert not wrong, f"{stage} must not import {wrong}"
    if stage not in ("commands", "devtools"):
        assert not any(m.startswith("applier.devtools") for m in _imports(path)), "runtime code imports devtools"


def test_few_modules_sit_loose_at_the_top() -> None:
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= 8, loose


def test_drivers_leave_replay_alone_and_executors_stand_on_their_own() -> None:
    """No driver imports ``replay`` (a command's driver: its ReplaySummary is built from the drivers'
    ApplyStats), and ``drivers/executors`` imports no other driver (replay and backlog use it)."""
    drivers = PACKAGE / "drivers"
    for path in sorted(drivers.rglob("*.py")):
        imports = _imports(path)
        if path != drivers / "replay.py":
            assert "applier.drivers.replay" not in imports, path
        if "executors" in path.relative_to(drivers).parts:
            outside = sorted(m for m in imports
                             if m.startswith("applier.drivers.") and not m.startswith("applier.drivers.executors"))
            assert not outside, (path, outside)


def test_what_spark_ships_to_executors_imports_without_spark() -> None:
    """Spark pickles the executors' task functions by reference (and the copy's tasks, instances, by
    their class): their modules must import on an executor's Python worker, and import no Spark."""
    import subprocess
    import sys

    code = ("import sys, applier.drivers.executors.task as t, applier.drivers.copy_tasks; "
            "assert t.fold_pickled.__module__ == t.collect.__module__ == 'applier.drivers.executors.task'; "
            "assert 'pyspark' not in sys.modules, 'pyspark imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]

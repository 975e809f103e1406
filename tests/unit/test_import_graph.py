"""applier's whole import graph: no circles and one layer order (issue 48).

Every import counts, the ones inside functions and under ``TYPE_CHECKING`` too: those are how circles
used to be hidden, and a module that imports its importer inside a function is still one piece of code
with it. ``test_layout.py`` holds the finer rules between the stages; this file holds the two that keep
the stages a stack: a lower layer never imports a higher one, and no module reaches itself again.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "applier"

#: the layers from the bottom; a module may import its own layer and the ones below it
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "lsn", "changes"),
    ("storage", "config", "infra", "spark", "state"),
    ("protocol", "catalog", "values"),
    ("assembly", "sources", "sink", "checks"),
    ("loop",),
    ("drivers",),
    ("api", "commands", "devtools", "__init__"),
    ("cli",),
)
LAYER_OF = {part: level for level, parts in enumerate(LAYERS) for part in parts}


def _module_names() -> dict[str, Path]:
    names: dict[str, Path] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("applier", *path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


MODULES = _module_names()


def _known(name: str) -> str | None:
    """The applier module an imported name lives in (``applier.x.y.func`` -> ``applier.x.y``)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    if node.level:
        base = module.split(".")
        if MODULES[module].name != "__init__.py":
            base = base[:-1]
        base = base[: len(base) - node.level + 1]
        origin = ".".join([*base, *([node.module] if node.module else [])])
    else:
        origin = node.module or ""
    for alias in node.names:  # `from applier.sink import engine` imports the module applier.sink.engine
        yield f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in MODULES else origin


@cache
def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                edges |= {t for name in _targets(module, node) if (t := _known(name)) and t != module}
        graph[module] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYER_OF[parts[1] if len(parts) > 1 else "__init__"]


def test_every_part_of_applier_has_a_layer() -> None:
    missing = sorted({m.split(".")[1] for m in MODULES if "." in m} - set(LAYER_OF))
    assert not missing, f"give these a place in LAYERS: {missing}"


def test_no_import_circles() -> None:
    found = circles(import_graph())
    assert not found, "import circles (function-level imports count):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_layer_imports_a_higher_one() -> None:
    upward = sorted(f"{module} imports {target}" for module, targets in import_graph().items()
                    for target in targets if _layer(target) > _layer(module))
    assert not upward, "imports against the layer order:\n" + "\n".join(upward)


def test_the_checker_sees_a_circle_and_an_upward_import() -> None:
    """The checks above can fail: a made-up graph with a circle through a function-level import."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    source = "def f():\n    from applier.loop import ApplyLoop\n"
    node = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom))
    target = _known(next(_targets("applier.sink.engine", node)))
    assert target == "applier.loop" and _layer(target) > _layer("applier.sink.engine")

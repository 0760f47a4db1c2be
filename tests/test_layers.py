"""The house's imports point one way: down its floors, and never round a circle.

Read from the code as text (nothing is imported): a module's imports at its top level,
those under `if TYPE_CHECKING:` left out, since they run only for the type checker.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FLOORS = {"relayq": 0, "store": 1, "tasks": 2, "workers": 3, "api": 3, "bench": 3, "cli": 4}
"""Each package imports only from packages on floors below its own."""

TASKS_ROOMS = (("tasks.client",), ("tasks.runner",))
"""Inside tasks/, from the top down: the client's side, then the worker's; what lies
beside them (hooks, settings, the broker, observability, webhooks) is below both."""


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def house() -> dict[str, Path]:
    return {
        module_name(path): path for package in FLOORS for path in (ROOT / package).rglob("*.py")
    }


def _type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements that run when the module is imported: its body, and the bodies of
    its `if`s and `try`s (an import made on demand inside a function is not one)."""
    for node in body:
        if _type_checking(node):
            continue
        yield node
        for inner in ("body", "orelse", "finalbody"):
            yield from _top_level(getattr(node, inner, []))
        for handler in getattr(node, "handlers", []):
            yield from _top_level(handler.body)


def imports(path: Path, known: dict[str, Path], *, top_only: bool) -> set[str]:
    """The house's modules `path` imports (a `from m import name` naming a submodule
    counts as that submodule)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = _top_level(tree.body) if top_only else _all_but_type_checking(tree)
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(_known(alias.name, known) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                found.add(_known(f"{node.module}.{alias.name}", known))
    found.discard("")
    found.discard(module_name(path))
    return found


def _all_but_type_checking(tree: ast.Module) -> Iterator[ast.AST]:
    skipped = {id(n) for s in tree.body if _type_checking(s) for n in ast.walk(s)}
    return (node for node in ast.walk(tree) if id(node) not in skipped)


def _known(name: str, known: dict[str, Path]) -> str:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name


def test_every_import_points_down_the_floors_of_the_house():
    known = house()
    upward = [
        f"{name} imports {target}"
        for name, path in known.items()
        for target in imports(path, known, top_only=False)
        if FLOORS[target.split(".")[0]] >= FLOORS[name.split(".")[0]]
        and target.split(".")[0] != name.split(".")[0]
    ]
    assert upward == []


def test_inside_tasks_the_client_builds_on_the_runner_and_neither_is_imported_from_below():
    known = house()

    def room(name: str) -> int:
        for floor, prefixes in enumerate(TASKS_ROOMS):
            if any(name == p or name.startswith(p + ".") for p in prefixes):
                return len(TASKS_ROOMS) - floor
        return 0  # beside them: below both

    upward = [
        f"{name} imports {target}"
        for name, path in known.items()
        if name.startswith("tasks.")  # the package's face (tasks/__init__) is above all
        for target in imports(path, known, top_only=False)
        if target.startswith("tasks.") and room(target) > room(name)
    ]
    assert upward == []


def test_no_modules_import_each_other_round_a_circle():
    known = house()
    graph = {name: imports(path, known, top_only=True) for name, path in known.items()}
    circles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done

    def walk(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(graph.get(name, ())):
            if state.get(target) == 1:
                circles.append([*path[path.index(target) :], target])
            elif target not in state:
                walk(target, [*path, target])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name, [name])
    # A package importing its own submodules is how its face works, not a circle.
    circles = [c for c in circles if not any(b.startswith(a + ".") for a, b in pairwise(c))]
    assert circles == []

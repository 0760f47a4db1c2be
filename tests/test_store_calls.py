"""Every store call from an event loop goes through the one seam, `tasks.storeio.StoreCalls`
(a runtime's `io`, a client's `store`): inline on SQLite while its lock is free, on a
thread pool otherwise. A bare thread hop (`asyncio.to_thread`, `run_in_executor`) with the
store in hand would skip that choice and the client's own threads, which `close` waits for."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("api", "cli", "tasks", "workers")
SEAMS = {Path("tasks/storeio.py")}
HOPS = {"to_thread", "run_in_executor"}


def _store_names(tree: ast.Module) -> set[str]:
    """The names this module imports from store/."""
    return {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "store"
        for alias in node.names
    }


def _holds_the_store(arg: ast.expr, from_store: set[str]) -> bool:
    """A store function, or a database (`db`, `client.db`), handed to the thread."""
    if isinstance(arg, ast.Name):
        return arg.id in from_store or arg.id == "db"
    return isinstance(arg, ast.Attribute) and arg.attr == "db"


def _bare_hops(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    from_store = _store_names(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        if node.func.attr not in HOPS:
            continue
        args = [*node.args, *(k.value for k in node.keywords)]
        if any(_holds_the_store(a, from_store) for a in args):
            found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_no_store_call_takes_a_thread_of_its_own():
    offenders = [
        hop
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.relative_to(ROOT) not in SEAMS
        for hop in _bare_hops(path)
    ]
    assert offenders == [], "store calls past tasks.storeio: " + ", ".join(offenders)


def test_the_check_finds_a_bare_hop(tmp_path: Path):
    # A rule that cannot fail proves nothing: a module with each kind of bare hop
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import asyncio\nfrom store import get_request\n"
        "async def a(client, rid):\n"
        "    return await asyncio.to_thread(get_request, client.db, rid)\n"
        "async def b(loop, db):\n    return await loop.run_in_executor(None, len, db)\n"
        "async def c(x):\n    return await asyncio.to_thread(len, x)\n"
    )
    assert _bare_hops(sample, tmp_path) == ["sample.py:4", "sample.py:6"]

"""No file tool leaves the base directory, even while links are swapped in under it.

A thread keeps swapping a folder, or a file, with a symlink to the outside
(atomically, with renameat2, so the name always exists), while a tool writes
or reads through that path hundreds of times. Whatever each call returns,
nothing outside is ever written or read.
Hard links are refused outright: another name of the same file may lie outside.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .calls import call as _call

SECRET = "the secret outside\n"
ROUNDS = 400


@dataclass(frozen=True)
class World:
    base: Path
    outside: Path

    def outside_files(self) -> dict[str, str]:
        return {
            p.relative_to(self.outside).as_posix(): p.read_text()
            for p in sorted(self.outside.rglob("*"))
            if p.is_file()
        }


@pytest.fixture
def world(tmp_path: Path) -> World:
    base, outside = tmp_path / "base", tmp_path / "outside"
    base.mkdir()
    outside.mkdir()
    (outside / "f.txt").write_text(SECRET)
    (base / "d").mkdir()
    (base / "d" / "f.txt").write_text("inside\n")
    (base / "f.txt").write_text("inside\n")
    return World(base, outside)


@contextlib.contextmanager
def _swapping(step: Callable[[], None]) -> Iterator[list[int]]:
    """Run `step` in a loop on another thread; yields a one-item list counting the rounds."""
    stop = threading.Event()
    rounds = [0]

    def loop() -> None:
        while not stop.is_set():
            step()
            rounds[0] += 1

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield rounds
    finally:
        stop.set()
        thread.join(5)


_libc = ctypes.CDLL(None, use_errno=True)
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> None:
    """Swap two names atomically (renameat2 RENAME_EXCHANGE): each always exists."""
    if _libc.renameat2(_AT_FDCWD, bytes(a), _AT_FDCWD, bytes(b), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(a))


def _swapper(world: World, name: str, target: Path) -> Callable[[], None]:
    """`base/name` is, in turns, what it was and a symlink to `target` outside."""
    real, link = world.base / name, world.base / f"{name}.link"
    link.symlink_to(target)

    def step() -> None:
        _exchange(real, link)
        time.sleep(0.0002)  # long enough for a call to walk into either state

    return step


def _swap_folder(world: World) -> Callable[[], None]:
    return _swapper(world, "d", world.outside)


def _swap_file(world: World) -> Callable[[], None]:
    return _swapper(world, "f.txt", world.outside / "f.txt")


@pytest.mark.parametrize(("path", "swap"), [("d/f.txt", _swap_folder), ("f.txt", _swap_file)])
async def test_writes_never_land_outside_while_a_symlink_is_swapped_in(
    world: World, path: str, swap: Callable[[World], Callable[[], None]]
) -> None:
    with _swapping(swap(world)) as rounds:
        for i in range(ROUNDS):
            out = await _call(world.base, "write", {"path": path, "content": f"write {i}\n"})
            assert "write" not in world.outside_files().get("f.txt", ""), f"write {i} escaped"
            if out.is_error:
                assert "Traceback" not in out.output

    assert rounds[0] > 0
    assert world.outside_files() == {"f.txt": SECRET}


@pytest.mark.parametrize(("path", "swap"), [("d/f.txt", _swap_folder), ("f.txt", _swap_file)])
@pytest.mark.parametrize("tool", ["read", "grep"])
async def test_reads_never_see_outside_while_a_symlink_is_swapped_in(
    world: World, path: str, swap: Callable[[World], Callable[[], None]], tool: str
) -> None:
    args = {"path": path} if tool == "read" else {"pattern": "secret|inside", "path": path}
    seen_inside = 0
    with _swapping(swap(world)):
        for _ in range(ROUNDS):
            out = await _call(world.base, tool, args)
            assert "secret" not in out.output.replace("secret|inside", "")
            seen_inside += "inside" in out.output

    assert seen_inside > 0


async def test_edits_never_change_outside_while_a_symlink_is_swapped_in(world: World) -> None:
    # The same text inside as outside, so an edit that escaped would change it there.
    (world.base / "f.txt").write_text(SECRET)
    edits = 0
    with _swapping(_swap_file(world)):
        for i in range(ROUNDS):
            old, new = ("secret", "SECRET") if i % 2 == 0 else ("SECRET", "secret")
            args = {"path": "f.txt", "old_string": old, "new_string": new}
            out = await _call(world.base, "edit", args)
            edits += not out.is_error

    assert edits > 0
    assert world.outside_files() == {"f.txt": SECRET}


# -- hard links ----------------------------------------------------------------


@pytest.fixture
def hard_linked(world: World) -> World:
    os.link(world.outside / "f.txt", world.base / "hl.txt")
    return world


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("read", {"path": "hl.txt"}),
        ("write", {"path": "hl.txt", "content": "pwned\n"}),
        ("edit", {"path": "hl.txt", "old_string": "secret", "new_string": "pwned"}),
        (
            "apply_patch",
            {
                "patch": "*** Begin Patch\n*** Update File: hl.txt\n@@\n-the secret outside\n"
                "+pwned\n*** End Patch"
            },
        ),
    ],
)
async def test_a_hard_linked_file_is_neither_read_nor_written(
    hard_linked: World, tool: str, args: dict[str, Any]
) -> None:
    out = await _call(hard_linked.base, tool, args)

    assert out.is_error
    assert "hl.txt has 2 hard links" in out.output
    assert "secret" not in out.output.replace("old_string", "")
    assert hard_linked.outside_files() == {"f.txt": SECRET}


async def test_grep_skips_a_hard_linked_file_and_says_so(hard_linked: World) -> None:
    out = await _call(hard_linked.base, "grep", {"pattern": "secret"})

    assert out.output == "No matches for 'secret'.\nskipped: hl.txt (2 hard links)"

"""Walking a folder inside the base directory, one open descriptor per level.

Each folder is opened relative to its parent with O_NOFOLLOW and listed by
descriptor, so the walk never leaves the base, whatever is renamed or swapped
meanwhile. A symlinked folder is not descended into; a symlinked file is kept
(shown where the link sits) when its target is a file inside the base. What
cannot be walked (a symlink loop, a file with several hard links) is skipped
and named in `Walker.notes`, so one bad entry never fails the whole search.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Generator, Iterator
from dataclasses import dataclass

from relayq.builtins._common import Deadline, ToolFailure
from relayq.builtins._fileio import HardLinked, Missing, open_existing
from relayq.builtins._paths import DIR_FLAGS, Base, LinkLoop, Spot, locate

__all__ = ["Found", "Walker"]

_SKIPPED_DIRS = frozenset({".git"})
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_MAX_NOTES = 20


@dataclass(frozen=True)
class Found:
    """A file met by the walk; `dir_fd` is only open while the walk stands on it."""

    shown: str
    """Relative to the base directory."""
    rel: str
    """Relative to the folder searched."""
    dir_fd: int
    name: str
    link: bool


class Walker:
    """The files under one root, in the order of their shown paths."""

    def __init__(self, base: Base, deadline: Deadline) -> None:
        self.base = base
        self.deadline = deadline
        self._notes: list[str] = []
        self._skipped = 0

    def note(self, shown: str, why: str) -> None:
        self._skipped += 1
        if len(self._notes) < _MAX_NOTES:
            self._notes.append(f"skipped: {shown} ({why})")

    @property
    def notes(self) -> list[str]:
        extra = self._skipped - len(self._notes)
        return [*self._notes, *([f"skipped: {extra} more"] if extra else [])]

    def is_folder(self, root: Spot) -> bool:
        """Whether `root` is a folder (else a file); Missing when it is neither."""
        if root.missing:
            raise Missing("path not found")
        if not root.name:
            return True
        try:
            info = os.stat(root.name, dir_fd=root.dir_fd, follow_symlinks=False)
        except FileNotFoundError as exc:
            raise Missing("path not found") from exc
        return stat.S_ISDIR(info.st_mode)

    def files(self, root: Spot) -> Generator[Found, None, None]:
        """Every file under `root` (or `root` itself when it is a file)."""
        if not self.is_folder(root):
            yield Found(root.shown, root.name, root.dir_fd, root.name, link=False)
            return
        if not root.name:
            yield from self._folder(os.dup(root.dir_fd), root.folder, "")
            return
        fd = _open_dir(root.dir_fd, root.name)
        if fd is None:
            raise ToolFailure(f"{root.shown} cannot be searched: it changed while it was opened")
        yield from self._folder(fd, root.shown, "")

    def _folder(self, fd: int, shown: str, rel: str) -> Iterator[Found]:
        """The files under the open folder `fd`, which this closes."""
        try:
            for name, kind in self._entries(fd):
                inner = f"{shown}/{name}" if shown else name
                inner_rel = f"{rel}/{name}" if rel else name
                if kind == "dir":
                    sub = _open_dir(fd, name)
                    if sub is not None:
                        yield from self._folder(sub, inner, inner_rel)
                elif kind == "file" or self._links_to_file(inner):
                    yield Found(inner, inner_rel, fd, name, link=kind == "link")
        finally:
            os.close(fd)

    def _entries(self, fd: int) -> list[tuple[str, str]]:
        self.deadline.check()
        keyed: list[tuple[str, str, str]] = []
        with os.scandir(fd) as listing:
            for entry in listing:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name not in _SKIPPED_DIRS:
                        # "a/" sorts as the paths under it do, so the walk's order is
                        # the order of the shown paths.
                        keyed.append((entry.name + "/", entry.name, "dir"))
                elif entry.is_symlink():
                    keyed.append((entry.name, entry.name, "link"))
                elif entry.is_file(follow_symlinks=False):
                    keyed.append((entry.name, entry.name, "file"))
        keyed.sort()
        return [(name, kind) for _, name, kind in keyed]

    def _links_to_file(self, shown: str) -> bool:
        try:
            with locate(self.base, shown) as spot:
                if spot.missing or not spot.name:
                    return False
                info = os.stat(spot.name, dir_fd=spot.dir_fd, follow_symlinks=False)
        except LinkLoop:
            self.note(shown, "symlink loop")
            return False
        except (ToolFailure, OSError):
            return False  # outside the base, dangling, or gone
        return stat.S_ISREG(info.st_mode)

    def open(self, found: Found) -> int | None:
        """`found` opened for reading, or None (and a note when that says something)."""
        if found.link:
            try:
                fd, _ = open_existing(self.base, found.shown, verb="searched")
            except ToolFailure as exc:
                self._note_failure(found.shown, exc)
                return None
            return fd
        try:
            fd = os.open(found.name, _READ, dir_fd=found.dir_fd)
        except OSError:
            return None  # gone, or swapped for a link: skipped as grep -s does
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
            return fd
        os.close(fd)
        if stat.S_ISREG(info.st_mode):
            self.note(found.shown, f"{info.st_nlink} hard links")
        return None

    def _note_failure(self, shown: str, exc: ToolFailure) -> None:
        if isinstance(exc, LinkLoop):
            self.note(shown, "symlink loop")
        elif isinstance(exc, HardLinked):
            self.note(shown, f"{exc.links} hard links")


def _open_dir(parent: int, name: str) -> int | None:
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent)
    except OSError:
        return None  # gone, unreadable, or swapped for a link since it was listed

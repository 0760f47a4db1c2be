"""Keeping file tools inside the base directory, with no check-then-open race.

A path is never handed to the kernel whole. It is walked one name at a time
from an open descriptor of the base directory: each folder is opened relative
to the one before it with O_NOFOLLOW, and a symlink met on the way is read
(readlinkat) and its target walked the same way, so a link is followed only
while it stays inside. Nothing checked is opened again by name later, so a
folder swapped for a symlink between two steps cannot lead outside: the walk
either follows the new link inside the base or refuses it. `..`, absolute
paths and `~` are judged by the same walk.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from relayq._tools import ToolContext
from relayq.builtins._common import ToolFailure

__all__ = [
    "DIR_FLAGS",
    "Base",
    "LinkLoop",
    "Spot",
    "base_of",
    "locate",
    "open_base",
]

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# The kernel's own limit on links followed while resolving one path.
_MAX_LINKS = 40


class LinkLoop(ToolFailure):
    """A path whose symlinks never end (a -> b -> a)."""


def base_of(ctx: ToolContext) -> Path:
    """The resolved base directory; read at call time so one tool serves many runs."""
    base = ctx.base_dir.resolve()
    if not base.is_dir():
        raise ToolFailure(f"the base directory {ctx.base_dir} does not exist")
    return base


@dataclass(frozen=True)
class Base:
    """An open descriptor of the base directory and the prefixes that name it."""

    fd: int
    path: Path
    roots: tuple[tuple[str, ...], ...]
    """Absolute paths (as parts) that mean the base: resolved, and as configured."""


@contextlib.contextmanager
def open_base(ctx: ToolContext) -> Iterator[Base]:
    path = base_of(ctx)
    roots = {Path(path).parts, Path(os.path.abspath(ctx.base_dir)).parts}
    # The base itself is trusted configuration, so following its own links is fine.
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield Base(fd=fd, path=path, roots=tuple(sorted(roots, key=len, reverse=True)))
    finally:
        os.close(fd)


@dataclass
class Spot:
    """Where a path leads: a name in an open folder inside the base.

    `missing` are folders between `dir_fd` and `name` that do not exist yet;
    `name` is "" when the path is a folder reached by `.` or `..`.
    """

    dir_fd: int
    folder: str
    """Where `dir_fd` is, relative to the base ("" for the base itself)."""
    missing: list[str]
    name: str
    shown: str
    """The path relative to the base, links followed, `/`-separated ("." is the base)."""
    _closed: bool = field(default=False, repr=False)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            os.close(self.dir_fd)

    def __enter__(self) -> Spot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def locate(base: Base, raw: str) -> Spot:
    """Walk `raw` from the base, following links only inside it; the last name is not opened.

    Raises a ToolFailure when the path leaves the base, loops or cannot be walked.
    """
    if raw == "":
        raise ToolFailure("path must not be empty")
    if "\0" in raw:
        raise ToolFailure(f"path {raw!r} cannot be resolved: it contains a NUL byte")
    walk = _Walk(base, raw)
    try:
        return walk.run(_relative_parts(base, raw))
    finally:
        walk.close()


def _relative_parts(base: Base, raw: str) -> list[str]:
    text = os.path.expanduser(raw) if raw.startswith("~") else raw
    if not text.startswith("/"):
        return text.split("/")
    inner = _below_root(base, PurePosixPath(text).parts)
    if inner is None:
        raise ToolFailure(f"path {raw} is outside the base directory")
    return inner


def _below_root(base: Base, parts: tuple[str, ...]) -> list[str] | None:
    for root in base.roots:
        if parts[: len(root)] == root:
            return list(parts[len(root) :])
    return None


class _Walk:
    """The folders walked so far: open descriptors from the base down, then missing names."""

    def __init__(self, base: Base, raw: str) -> None:
        self.base = base
        self.raw = raw
        self.fds = [os.dup(base.fd)]
        self.names: list[str] = []  # one per fd after the base's
        self.missing: list[str] = []
        self.through_file = False  # the first missing name is a file, not an absence
        self.links = 0

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def run(self, parts: list[str]) -> Spot:
        todo = deque(parts)
        name = ""
        while todo:
            part = todo.popleft()
            name = ""
            if part in ("", "."):
                continue
            if part == "..":
                self._up()
            elif todo:
                self._down(part, todo)
            elif not self._follow(part, todo):
                name = part
        return self._spot(name)

    def _spot(self, name: str) -> Spot:
        shown = "/".join([*self.names, *self.missing, *([name] if name else [])]) or "."
        folder = "/".join(self.names)
        return Spot(self.fds.pop(), folder, list(self.missing), name, shown)

    def _outside(self) -> ToolFailure:
        return ToolFailure(f"path {self.raw} is outside the base directory")

    def _up(self) -> None:
        if self.missing:
            if self.through_file:
                # As the kernel would: `file/..` is no path, not the file's folder.
                raise ToolFailure(f"path {self.raw} goes through {self.missing[0]}, a file")
            self.missing.pop()
        elif len(self.fds) > 1:
            os.close(self.fds.pop())
            self.names.pop()
        else:
            raise self._outside()

    def _down(self, part: str, todo: deque[str]) -> None:
        """Step into folder `part`, or expand it when it is a symlink."""
        if self.missing:
            self.missing.append(part)
            return
        try:
            fd = os.open(part, DIR_FLAGS, dir_fd=self.fds[-1])
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                if not self._follow(part, todo):
                    # Missing, or a file: whoever writes here learns which.
                    self.through_file = exc.errno != errno.ENOENT
                    self.missing.append(part)
                return
            raise
        self.fds.append(fd)
        self.names.append(part)

    def _follow(self, part: str, todo: deque[str]) -> bool:
        """If `part` is a symlink, queue its target in its place and say so."""
        if self.missing:
            return False
        try:
            target = os.readlink(part, dir_fd=self.fds[-1])
        except OSError as exc:
            if exc.errno in (errno.EINVAL, errno.ENOENT, errno.ENOTDIR):
                return False  # not a link, or not there
            raise
        self.links += 1
        if self.links > _MAX_LINKS:
            raise LinkLoop(f"path {self.raw} cannot be resolved: symlink loop")
        if target.startswith("/"):
            inner = _below_root(self.base, PurePosixPath(target).parts)
            if inner is None:
                raise self._outside()
            while len(self.fds) > 1:
                os.close(self.fds.pop())
            self.names.clear()
            todo.extendleft(reversed(inner))
        else:
            todo.extendleft(reversed(target.split("/")))
        return True

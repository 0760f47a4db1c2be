"""Opening, writing and removing files found by `locate`, never following a link.

Each open names one entry in an already open folder with O_NOFOLLOW; when that
entry was swapped for a symlink since `locate` looked (ELOOP), the path is
walked again, so the link is judged like any other. Files with more than one
hard link are refused for reading and writing: another name of the same file
may lie outside the base directory.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator

from relayq.builtins._common import ToolFailure
from relayq.builtins._paths import DIR_FLAGS, Base, Spot, locate

__all__ = [
    "HardLinked",
    "IsFolder",
    "Missing",
    "check_regular",
    "decode_utf8",
    "open_existing",
    "read_all",
    "remove_dir",
    "remove_file",
    "write_fd",
    "write_file",
]

_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_UPDATE = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_REWRITE = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# A path that keeps changing under us is given up on after this many walks.
_ATTEMPTS = 8
_CHUNK = 1024 * 1024


class Missing(ToolFailure):
    """The path leads to nothing."""


class IsFolder(ToolFailure):
    """The path leads to a folder where a file was expected."""


class HardLinked(ToolFailure):
    """A file with more than one name, so possibly one outside the base directory."""

    def __init__(self, message: str, links: int) -> None:
        super().__init__(message)
        self.links = links


class _Changed(Exception):
    """An entry became a symlink (or vanished) between the walk and the open."""


def _give_up(raw: str) -> ToolFailure:
    return ToolFailure(f"{raw} kept changing while it was opened; try again")


def check_regular(fd: int, raw: str, verb: str) -> os.stat_result:
    """The file's stat, or a ToolFailure when it is no regular file with one link."""
    info = os.fstat(fd)
    if stat.S_ISDIR(info.st_mode):
        raise IsFolder(f"{raw} is a directory, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise ToolFailure(f"{raw} is not a regular file (a FIFO, socket or device); not {verb}")
    if info.st_nlink > 1:
        raise HardLinked(
            f"{raw} has {info.st_nlink} hard links, and another of its names may lie outside "
            f"the base directory; not {verb}",
            info.st_nlink,
        )
    return info


def open_existing(base: Base, raw: str, *, verb: str, update: bool = False) -> tuple[int, str]:
    """An open regular file at `raw` and where it is shown; `update` opens it read-write."""
    for _ in range(_ATTEMPTS):
        with locate(base, raw) as spot:
            if spot.missing:
                raise Missing(f"file not found: {raw}")
            try:
                fd = os.open(spot.name or ".", _UPDATE if update else _READ, dir_fd=spot.dir_fd)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    continue
                if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                    raise Missing(f"file not found: {raw}") from exc
                if exc.errno == errno.EISDIR:
                    raise IsFolder(f"{raw} is a directory, not a file") from exc
                raise
            try:
                check_regular(fd, raw, verb)
            except BaseException:
                os.close(fd)
                raise
            return fd, spot.shown
    raise _give_up(raw)


def read_all(fd: int, raw: str, max_bytes: int) -> bytes:
    """The whole file behind `fd`, in chunks so that no single call holds the GIL for long."""
    size = os.fstat(fd).st_size
    if size > max_bytes:
        raise ToolFailure(
            f"{raw} is {size} bytes, more than the {max_bytes} this tool handles; "
            "use bash for files this large"
        )
    parts: list[bytes] = []
    while chunk := os.read(fd, _CHUNK):
        parts.append(chunk)
    return b"".join(parts)


def decode_utf8(data: bytes, raw: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolFailure(
            f"{raw} is not UTF-8 text (invalid byte at offset {exc.start}); "
            "it is probably a binary file"
        ) from exc


def write_fd(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view[:_CHUNK]) :]


def write_file(base: Base, raw: str, data: bytes) -> tuple[str, list[str]]:
    """Create or overwrite the file at `raw`: where it is shown, and the folders made for it."""
    made: list[str] = []
    for _ in range(_ATTEMPTS):
        with locate(base, raw) as spot:
            if not spot.name:
                raise IsFolder(f"{raw} is a directory, not a file")
            try:
                with _parent(spot, made) as parent:
                    fd = _open_for_write(parent, spot.name, raw)
            except _Changed:
                continue
            try:
                write_fd(fd, data)
            finally:
                os.close(fd)
            return spot.shown, made
    raise _give_up(raw)


@contextlib.contextmanager
def _parent(spot: Spot, made: list[str]) -> Iterator[int]:
    """The folder that holds `spot.name`, its missing folders made (and named in `made`)."""
    fd = os.dup(spot.dir_fd)
    try:
        shown = spot.folder
        for name in spot.missing:
            shown = f"{shown}/{name}" if shown else name
            child = _make_dir(fd, name, shown, made)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def _make_dir(parent: int, name: str, shown: str, made: list[str]) -> int:
    """Folder `name` in `parent`, opened, made first when missing."""
    try:
        os.mkdir(name, 0o777, dir_fd=parent)
        made.append(shown)
    except FileExistsError:
        pass
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno == errno.ENOENT or _is_link(parent, name):
            raise _Changed from exc
        raise OSError(exc.errno, exc.strerror, shown) from exc


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _open_for_write(parent: int, name: str, raw: str) -> int:
    try:
        # A new file has no other name, wherever anything points.
        return os.open(name, _CREATE, 0o666, dir_fd=parent)
    except FileExistsError:
        pass
    try:
        fd = os.open(name, _REWRITE, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOENT):
            raise _Changed from exc
        if exc.errno == errno.EISDIR:
            raise IsFolder(f"{raw} is a directory, not a file") from exc
        if exc.errno == errno.ENXIO:
            raise ToolFailure(f"{raw} is not a regular file; not written") from exc
        raise
    try:
        # Checked before truncating, so a refused file keeps its content.
        check_regular(fd, raw, "written")
        os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def remove_file(base: Base, raw: str) -> None:
    """Remove the directory entry `raw` leads to (a link there is removed, not its target)."""
    with locate(base, raw) as spot:
        if spot.missing or not spot.name:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(spot.name, dir_fd=spot.dir_fd)


def remove_dir(base: Base, raw: str) -> None:
    """Remove the empty folder at `raw`."""
    with locate(base, raw) as spot:
        if not spot.missing and spot.name:
            os.rmdir(spot.name, dir_fd=spot.dir_fd)

"""Parsing the apply_patch envelope into file operations, without touching disk.

*** Begin Patch
*** Add File: path          then every line prefixed `+`
*** Delete File: path
*** Update File: path
*** Move to: new/path       optional
@@ optional context line    starts a hunk; lines then start with ' ', '-' or '+'
*** End of File             optional: the hunk ends at the end of the file
*** End Patch
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from relayq.builtins._common import ToolFailure

__all__ = ["AddFile", "DeleteFile", "Hunk", "Op", "PatchError", "UpdateFile", "parse_patch"]

_BEGIN = "*** Begin Patch"
_END = "*** End Patch"
_ADD = "*** Add File: "
_DELETE = "*** Delete File: "
_UPDATE = "*** Update File: "
_MOVE = "*** Move to: "
_EOF = "*** End of File"
# Models often write unified-diff hunk headers; the text after them is still useful.
_UNIFIED = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@ ?(.*)$")


class PatchError(ToolFailure):
    """The patch cannot be parsed or applied; nothing was changed."""


@dataclass
class Hunk:
    number: int
    """1-based position of the hunk within its file, for error messages."""
    header: str = ""
    """The text after `@@`: a line to find before the hunk's lines are looked for."""
    lines: list[tuple[str, str]] = field(default_factory=list)
    """Each line as its kind (' ' context, '-' removed, '+' added) and its text."""
    at_eof: bool = False
    raw: list[str] = field(default_factory=list, repr=False)
    """The hunk's lines as written in the patch, until parsing splits them into `lines`."""

    @property
    def old(self) -> list[str]:
        """The lines the hunk expects to find: context and removed ones."""
        return [text for kind, text in self.lines if kind != "+"]


@dataclass(frozen=True)
class AddFile:
    path: str
    lines: list[str]


@dataclass(frozen=True)
class DeleteFile:
    path: str


@dataclass(frozen=True)
class UpdateFile:
    path: str
    move_to: str | None
    hunks: list[Hunk]


Op = AddFile | DeleteFile | UpdateFile


class _Lines:
    """The patch's lines with a cursor; numbers in errors count from the patch's first line."""

    def __init__(self, lines: list[str], first: int) -> None:
        self.lines = lines
        self.first = first
        self.i = 0

    def more(self) -> bool:
        return self.i < len(self.lines)

    def peek(self) -> str:
        return self.lines[self.i]

    def take(self) -> str:
        line = self.lines[self.i]
        self.i += 1
        return line

    def error(self, message: str) -> PatchError:
        return PatchError(f"patch line {self.first + self.i}: {message}")


def parse_patch(text: str) -> list[Op]:
    """Every operation of the patch, in order, or a PatchError saying where it is malformed."""
    cur = _envelope(text)
    ops: list[Op] = []
    while cur.more():
        line = cur.peek()
        if line.startswith(_ADD):
            ops.append(_parse_add(cur))
        elif line.startswith(_DELETE):
            ops.append(DeleteFile(_path_after(cur, _DELETE)))
        elif line.startswith(_UPDATE):
            ops.append(_parse_update(cur))
        elif not line.strip():
            cur.take()
        else:
            raise cur.error(f"expected '{_ADD}', '{_DELETE}' or '{_UPDATE}', got {line!r}")
    if not ops:
        raise PatchError("the patch contains no file operations")
    return ops


def _envelope(text: str) -> _Lines:
    lines = text.replace("\r\n", "\n").split("\n")
    starts = [n for n, line in enumerate(lines) if line.strip() == _BEGIN]
    ends = [n for n, line in enumerate(lines) if line.strip() == _END]
    if not starts:
        raise PatchError(f"the patch must start with '{_BEGIN}'")
    if not ends or ends[-1] < starts[0]:
        raise PatchError(f"the patch must end with '{_END}'")
    begin, end = starts[0], ends[-1]
    return _Lines(lines[begin + 1 : end], first=begin + 2)


def _path_after(cur: _Lines, marker: str) -> str:
    path = cur.peek()[len(marker) :].strip()
    if not path:
        raise cur.error(f"'{marker.strip()}' needs a path")
    cur.take()
    return path


def _parse_add(cur: _Lines) -> AddFile:
    path = _path_after(cur, _ADD)
    lines: list[str] = []
    while cur.more() and not cur.peek().startswith("*** "):
        line = cur.peek()
        if line.startswith("+"):
            lines.append(cur.take()[1:])
        elif not line.strip():
            if _only_blank_until_next_op(cur):
                break
            cur.take()
            lines.append("")  # a blank line whose '+' an editor stripped
        else:
            raise cur.error(f"every line of an added file must start with '+', got {line!r}")
    return AddFile(path, lines)


def _only_blank_until_next_op(cur: _Lines) -> bool:
    rest = cur.lines[cur.i :]
    for line in rest:
        if line.startswith("*** "):
            return True
        if line.strip():
            return False
    return True


def _parse_update(cur: _Lines) -> UpdateFile:
    path = _path_after(cur, _UPDATE)
    move_to = _path_after(cur, _MOVE) if cur.more() and cur.peek().startswith(_MOVE) else None
    hunks: list[Hunk] = []
    while cur.more() and (cur.peek() == _EOF or not cur.peek().startswith("*** ")):
        _parse_line(cur, hunks)
    for hunk in hunks:
        _finish(hunk, path)
    if not hunks and move_to is None:
        raise PatchError(f"Update File {path}: no hunks (each starts with '@@')")
    return UpdateFile(path, move_to, hunks)


def _parse_line(cur: _Lines, hunks: list[Hunk]) -> None:
    line = cur.peek()
    if line.startswith("@@"):
        unified = _UNIFIED.match(line)
        header = unified.group(1) if unified else line[2:]
        hunks.append(Hunk(number=len(hunks) + 1, header=header.strip()))
    elif line == _EOF:
        if not hunks:
            raise cur.error(f"'{_EOF}' must close a hunk")
        hunks[-1].at_eof = True
    elif line == "" and not hunks:
        pass  # blank lines before the first hunk
    elif line[:1] in (" ", "-", "+", ""):
        if not hunks:
            hunks.append(Hunk(number=1))  # the first hunk may leave out its '@@'
        elif hunks[-1].at_eof:
            raise cur.error(f"'{_EOF}' must be the last line of its hunk")
        hunks[-1].raw.append(line)
    else:
        raise cur.error(
            f"a hunk line must start with ' ', '-' or '+' (or '@@' for a new hunk), got {line!r}"
        )
    cur.take()


def _finish(hunk: Hunk, path: str) -> None:
    raw = hunk.raw
    # Editors strip trailing spaces, turning a blank context line into an empty one;
    # trailing ones carry no change, so dropping them only loosens the match.
    while raw and raw[-1] == "":
        raw.pop()
    if not raw:
        raise PatchError(f"Update File {path}: hunk {hunk.number} has no lines")
    hunk.lines = [(line[:1] or " ", line[1:]) for line in raw]

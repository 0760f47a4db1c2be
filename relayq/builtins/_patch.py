"""The apply_patch builtin: all of a patch's file changes, or none of them.

Every new content is computed in memory first; disk is only written once the
whole patch is known to apply, and a write failing midway restores the files
already written. Files are keyed by where their path leads (links followed
inside the base), and every read and write goes through `_fileio`, so no link
leads outside the base directory, even one swapped in between plan and commit.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

from relayq._tools import Tool, ToolContext
from relayq.builtins._common import ToolFailure, req_str, sync_builtin, truncate
from relayq.builtins._config import BuiltinsConfig
from relayq.builtins._fileio import (
    IsFolder,
    Missing,
    open_existing,
    read_all,
    remove_dir,
    remove_file,
    write_file,
)
from relayq.builtins._files import MAX_EDIT_BYTES, read_text
from relayq.builtins._patch_parse import (
    AddFile,
    DeleteFile,
    Hunk,
    Op,
    PatchError,
    UpdateFile,
    parse_patch,
)
from relayq.builtins._paths import Base, locate, open_base

__all__ = ["apply_hunks", "apply_patch_tool"]

_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "patch": {
            "type": "string",
            "description": "The whole patch, from '*** Begin Patch' to '*** End Patch'.",
        }
    },
    "required": ["patch"],
    "additionalProperties": False,
}

_DESCRIPTION = """Change several files at once. Either the whole patch applies or nothing changes.

*** Begin Patch
*** Add File: path/new.py
+every line of the new file, each prefixed with +
*** Delete File: path/old.py
*** Update File: path/app.py
*** Move to: path/renamed.py      (optional)
@@ def handler():                  (optional: a line just above the change)
 context line, prefixed with a space
-line removed
+line added
*** End of File                    (optional: the hunk ends the file)
*** End Patch

Give about 3 lines of context around each change so it is found unambiguously.
Paths are relative to the working directory."""


def apply_patch_tool(config: BuiltinsConfig) -> Tool:
    def apply_patch(args: dict[str, Any], ctx: ToolContext) -> str:
        ops = parse_patch(req_str(args, "patch"))
        with open_base(ctx) as base:
            plan = _Plan(base)
            for op in ops:
                plan.add(op)
            plan.commit()
        return truncate("Applied patch:\n" + "\n".join(plan.summary), config.max_output_chars)

    return sync_builtin("apply_patch", _DESCRIPTION, _SCHEMA, apply_patch)


class _Plan:
    """The final content of every touched file (None: deleted), built before any write."""

    def __init__(self, base: Base) -> None:
        self.base = base
        self.changes: dict[str, str | None] = {}
        """Keyed by the path shown to the model: relative to the base, links followed."""
        self.summary: list[str] = []

    def add(self, op: Op) -> None:
        if isinstance(op, AddFile):
            self._add(op)
        elif isinstance(op, DeleteFile):
            self._delete(op)
        else:
            self._update(op)

    def _current(self, shown: str, raw: str) -> str | None:
        if shown in self.changes:
            return self.changes[shown]
        try:
            return read_text(self.base, raw, verb="patched")
        except Missing:
            return None
        except IsFolder as exc:
            raise PatchError(f"{raw} is a directory, not a file; nothing was changed") from exc

    def _resolve(self, raw: str) -> str:
        try:
            with locate(self.base, raw) as spot:
                return spot.shown
        except ToolFailure as exc:
            raise PatchError(f"{exc}; nothing was changed") from exc

    def _add(self, op: AddFile) -> None:
        shown = self._resolve(op.path)
        if self._current(shown, op.path) is not None:
            raise PatchError(
                f"Add File {op.path}: the file already exists (use Update File to change "
                "it); nothing was changed"
            )
        self.changes[shown] = "".join(line + "\n" for line in op.lines)
        self.summary.append(f"A {shown}")

    def _delete(self, op: DeleteFile) -> None:
        shown = self._resolve(op.path)
        if self._current(shown, op.path) is None:
            raise PatchError(f"Delete File {op.path}: no such file; nothing was changed")
        self.changes[shown] = None
        self.summary.append(f"D {shown}")

    def _update(self, op: UpdateFile) -> None:
        shown = self._resolve(op.path)
        text = self._current(shown, op.path)
        if text is None:
            raise PatchError(f"Update File {op.path}: no such file; nothing was changed")
        new = apply_hunks(text, op.hunks, op.path)
        if op.move_to is None:
            self.changes[shown] = new
            self.summary.append(f"M {shown}")
            return
        dest = self._resolve(op.move_to)
        if dest != shown and self._current(dest, op.move_to) is not None:
            raise PatchError(
                f"Update File {op.path}: cannot move to {op.move_to}, which already "
                "exists; nothing was changed"
            )
        self.changes[shown] = None
        self.changes[dest] = new
        self.summary.append(f"R {shown} -> {dest}")

    def commit(self) -> None:
        written: list[tuple[str, bytes | None]] = []
        made_dirs: list[str] = []
        shown = "."
        try:
            for shown, content in self.changes.items():
                # Recorded before the write so that a half-written file is restored too.
                written.append((shown, _snapshot(self.base, shown)))
                if content is None:
                    remove_file(self.base, shown)
                else:
                    _, made = write_file(self.base, shown, content.encode("utf-8"))
                    made_dirs.extend(made)
        except (OSError, ToolFailure) as exc:
            _restore(self.base, written, made_dirs)
            reason = (exc.strerror or str(exc)) if isinstance(exc, OSError) else str(exc)
            raise PatchError(
                f"could not write {shown}: {reason}; the files "
                "already written were restored, nothing was changed"
            ) from exc


def _snapshot(base: Base, shown: str) -> bytes | None:
    try:
        fd, _ = open_existing(base, shown, verb="patched")
    except Missing:
        return None
    try:
        return read_all(fd, shown, MAX_EDIT_BYTES)
    finally:
        os.close(fd)


def _restore(base: Base, written: list[tuple[str, bytes | None]], made_dirs: list[str]) -> None:
    # Best effort: a restore that fails too must not hide the original error.
    for shown, before in reversed(written):
        with contextlib.suppress(OSError, ToolFailure):
            if before is None:
                remove_file(base, shown)
            else:
                write_file(base, shown, before)
    for folder in reversed(made_dirs):
        with contextlib.suppress(OSError, ToolFailure):
            remove_dir(base, folder)


# -- hunks -------------------------------------------------------------------

_MATCHERS: tuple[Callable[[str], str], ...] = (
    lambda s: s,
    str.rstrip,
    str.strip,
)


def apply_hunks(text: str, hunks: list[Hunk], shown: str) -> str:
    """`text` with every hunk applied in order, or a PatchError naming the failing hunk."""
    newline = "\r\n" if "\r\n" in text else "\n"
    lines = text.split(newline)
    ends_with_newline = text == "" or lines[-1] == ""
    if lines[-1] == "":
        lines.pop()
    edits: list[tuple[int, Hunk]] = []
    cursor = 0
    for hunk in hunks:
        start = _locate(lines, hunk, cursor, shown)
        edits.append((start, hunk))
        cursor = start + len(hunk.old)
    for start, hunk in reversed(edits):
        length = len(hunk.old)
        lines[start : start + length] = _replacement(lines[start : start + length], hunk)
    if not lines:
        return ""
    return newline.join(lines) + (newline if ends_with_newline else "")


def _replacement(found: list[str], hunk: Hunk) -> list[str]:
    # Context lines keep the file's own text: a loose match on whitespace must
    # not rewrite the lines the patch only meant to point at.
    out: list[str] = []
    at = 0
    for kind, text in hunk.lines:
        if kind == "+":
            out.append(text)
            continue
        if kind == " ":
            out.append(found[at])
        at += 1
    return out


def _locate(lines: list[str], hunk: Hunk, cursor: int, shown: str) -> int:
    if hunk.header:
        found = _find(lines, [hunk.header], cursor, at_eof=False)
        if found is None:
            raise _hunk_error(hunk, shown, f"the @@ line {hunk.header!r} was not found")
        cursor = found
    if not hunk.old:
        # A hunk that only adds lines goes after its @@ line, or at the end of the file.
        return cursor + 1 if hunk.header and not hunk.at_eof else len(lines)
    start = _find(lines, hunk.old, cursor, at_eof=hunk.at_eof)
    if start is None:
        expected = "\n".join(hunk.old[:20])
        raise _hunk_error(hunk, shown, f"these lines were not found in order:\n{expected}")
    return start


def _find(lines: list[str], wanted: list[str], cursor: int, *, at_eof: bool) -> int | None:
    """Where `wanted` occurs from `cursor` on, trying exact matches before looser ones."""
    size = len(wanted)
    last = len(lines) - size
    for norm in _MATCHERS:
        target = [norm(w) for w in wanted]
        normed = [norm(x) for x in lines]
        # A hunk marked End of File is tried at the very end before anywhere else.
        candidates = [last, *range(cursor, last + 1)] if at_eof else range(cursor, last + 1)
        for start in candidates:
            if start >= cursor and normed[start : start + size] == target:
                return start
    return None


def _hunk_error(hunk: Hunk, shown: str, why: str) -> PatchError:
    where = f"hunk {hunk.number}" + (f" (@@ {hunk.header})" if hunk.header else "")
    return PatchError(f"Update File {shown}: {where} did not apply: {why}; nothing was changed")

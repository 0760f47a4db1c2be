"""The read, write and edit builtins.

Every file is reached through `_paths.locate` and opened by `_fileio`, so no
link leads outside the base directory; reading streams the file in chunks, so a
huge one neither fills memory nor holds the GIL (and with it the event loop).
"""

from __future__ import annotations

import codecs
import os
import re
from typing import Any

from relayq._tools import Tool, ToolContext
from relayq.builtins._common import (
    Deadline,
    OutputSink,
    ToolFailure,
    opt_bool,
    opt_int,
    req_str,
    sync_builtin,
)
from relayq.builtins._config import BuiltinsConfig
from relayq.builtins._fileio import (
    IsFolder,
    decode_utf8,
    open_existing,
    read_all,
    write_fd,
    write_file,
)
from relayq.builtins._paths import Base, open_base

__all__ = ["MAX_EDIT_BYTES", "edit_tool", "read_text", "read_tool", "split_lines", "write_tool"]

_DEFAULT_LIMIT = 2000
_CHUNK = 1024 * 1024
# edit and apply_patch hold a file whole, several times over; past this, use bash.
MAX_EDIT_BYTES = 32 * 1024 * 1024
# Only \n, \r\n and \r end a line, as editors and grep count them.
_BREAK = re.compile(r"\r\n|\r|\n")

_PATH_DOC = "Path relative to the working directory (an absolute path must lie inside it)."


def read_text(base: Base, raw: str, *, verb: str) -> str:
    """A whole UTF-8 file, or a ToolFailure that says why it cannot be read as text."""
    fd, _ = open_existing(base, raw, verb=verb)
    try:
        return decode_utf8(read_all(fd, raw, MAX_EDIT_BYTES), raw)
    finally:
        os.close(fd)


def split_lines(text: str) -> list[str]:
    """Lines without their endings; a final newline does not start an empty line."""
    lines = _BREAK.split(text)
    if lines[-1] == "":
        lines.pop()
    return lines


# -- read --------------------------------------------------------------------

_READ_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": _PATH_DOC},
        "offset": {
            "type": "integer",
            "minimum": 1,
            "description": "1-based number of the first line to show. Default 1.",
        },
        "limit": {
            "type": "integer",
            "minimum": 1,
            "description": f"How many lines to show at most. Default {_DEFAULT_LIMIT}.",
        },
    },
    "required": ["path"],
    "additionalProperties": False,
}


def read_tool(config: BuiltinsConfig) -> Tool:
    seconds = config.file_timeout.total_seconds()

    def read(args: dict[str, Any], ctx: ToolContext) -> str:
        raw = req_str(args, "path")
        offset = opt_int(args, "offset", 1, minimum=1)
        limit = opt_int(args, "limit", _DEFAULT_LIMIT, minimum=1)
        with open_base(ctx) as base:
            try:
                fd, _ = open_existing(base, raw, verb="read")
            except IsFolder as exc:
                raise ToolFailure(f"{exc}; use glob to list its files") from exc
        window = _Window(offset, offset - 1 + limit, OutputSink(config.max_output_chars))
        try:
            _stream(fd, raw, window, Deadline(seconds, f"read of {raw}"))
        finally:
            os.close(fd)
        return window.close(raw)

    return sync_builtin(
        "read",
        "Read a UTF-8 text file. Each line is shown as its 1-based line number, a tab "
        f"and the line. Shows {_DEFAULT_LIMIT} lines from the start unless offset and "
        "limit choose another window; says when the file continues past the window.",
        _READ_SCHEMA,
        read,
    )


def _stream(fd: int, raw: str, window: _Window, deadline: Deadline) -> None:
    """Decode the file chunk by chunk into `window`, checking it is UTF-8 throughout."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    fed = 0
    while True:
        deadline.check()
        chunk = os.read(fd, _CHUNK)
        held = len(decoder.getstate()[0])
        try:
            window.feed(decoder.decode(chunk, not chunk))
        except UnicodeDecodeError as exc:
            raise ToolFailure(
                f"{raw} is not UTF-8 text (invalid byte at offset {fed - held + exc.start}); "
                "it is probably a binary file"
            ) from exc
        if not chunk:
            return
        fed += len(chunk)


class _Window:
    """Numbers the lines of a text fed in pieces and shows those from `first` to `last`.

    Lines pass straight into the sink, so a window over a huge file (or one huge
    line) holds no more than the sink keeps.
    """

    def __init__(self, first: int, last: int, sink: OutputSink) -> None:
        self.first = first
        self.last = last
        self.sink = sink
        self.done = 0  # lines ended so far
        self.open = False  # a line has begun and not ended
        self.cr = False  # the last piece ended with \r, so a leading \n belongs to it

    def feed(self, text: str) -> None:
        if self.cr and text.startswith("\n"):
            text = text[1:]
        self.cr = text.endswith("\r")
        if not text:
            return
        if self.done >= self.last:
            # Past the window only the count matters: no per-line work.
            self.done += text.count("\n") + text.count("\r") - text.count("\r\n")
            self.open = not text.endswith(("\n", "\r"))
            return
        for i, part in enumerate(_BREAK.split(text)):
            if i:
                self._end_line()
            if part:
                self._show(part)

    def _show(self, part: str) -> None:
        number = self.done + 1
        if self.first <= number <= self.last:
            if not self.open:
                self.sink.add(("\n" if number > self.first else "") + f"{number:>6}\t")
            self.sink.add(part)
        self.open = True

    def _end_line(self) -> None:
        if not self.open:
            self._show("")
        self.done += 1
        self.open = False

    def close(self, shown: str) -> str:
        total = self.done + (1 if self.open else 0)
        if total == 0:
            return f"({shown} is empty)"
        if self.first > total:
            raise ToolFailure(
                f"offset {self.first} is past the end of {shown}, which has {total} lines"
            )
        end = min(self.last, total)
        if end < total:
            self.sink.add(
                f"\n(showing lines {self.first}-{end} of {total}; "
                f"pass offset={end + 1} to read more)"
            )
        return self.sink.text()


# -- write -------------------------------------------------------------------

_WRITE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": _PATH_DOC},
        "content": {"type": "string", "description": "The whole new content of the file."},
    },
    "required": ["path", "content"],
    "additionalProperties": False,
}


def write_tool(config: BuiltinsConfig) -> Tool:
    def write(args: dict[str, Any], ctx: ToolContext) -> str:
        raw = req_str(args, "path")
        content = req_str(args, "content", allow_empty=True)
        data = content.encode("utf-8")
        with open_base(ctx) as base:
            shown, _ = write_file(base, raw, data)
        return f"Wrote {len(data)} bytes to {shown}"

    return sync_builtin(
        "write",
        "Create or overwrite a file with the given UTF-8 content, creating missing "
        "parent folders. Replaces the whole file: to change part of a file use edit.",
        _WRITE_SCHEMA,
        write,
    )


# -- edit --------------------------------------------------------------------

_EDIT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": _PATH_DOC},
        "old_string": {
            "type": "string",
            "description": "The exact text to replace, including whitespace and indentation. "
            "Must occur exactly once unless replace_all is true.",
        },
        "new_string": {
            "type": "string",
            "description": "The text to put in its place; must differ from old_string.",
        },
        "replace_all": {
            "type": "boolean",
            "description": "Replace every occurrence instead of requiring a unique one. "
            "Default false.",
        },
    },
    "required": ["path", "old_string", "new_string"],
    "additionalProperties": False,
}


def edit_tool(config: BuiltinsConfig) -> Tool:
    def edit(args: dict[str, Any], ctx: ToolContext) -> str:
        raw = req_str(args, "path")
        old = req_str(args, "old_string")
        new = req_str(args, "new_string", allow_empty=True)
        replace_all = opt_bool(args, "replace_all", False)
        if old == new:
            raise ToolFailure("old_string and new_string are the same; nothing would change")
        with open_base(ctx) as base:
            fd, shown = open_existing(base, raw, verb="edited", update=True)
        try:
            text = decode_utf8(read_all(fd, raw, MAX_EDIT_BYTES), raw)
            made = _replace(text, old, new, raw, replace_all)
            # The same open file is rewritten: no second walk that a swap could divert.
            os.lseek(fd, 0, os.SEEK_SET)
            os.ftruncate(fd, 0)
            write_fd(fd, made[0].encode("utf-8"))
        finally:
            os.close(fd)
        noun = "replacement" if made[1] == 1 else "replacements"
        return f"Made {made[1]} {noun} in {shown}"

    return sync_builtin(
        "edit",
        "Replace an exact string in a UTF-8 text file. old_string must match the file "
        "exactly (whitespace included) and occur once, unless replace_all is true. Read "
        "the file first so the text is copied exactly.",
        _EDIT_SCHEMA,
        edit,
    )


def _replace(text: str, old: str, new: str, raw: str, replace_all: bool) -> tuple[str, int]:
    count = text.count(old)
    if count == 0:
        raise ToolFailure(
            f"old_string was not found in {raw}; read the file and copy "
            "the text exactly, whitespace included"
        )
    if count > 1 and not replace_all:
        raise ToolFailure(
            f"old_string occurs {count} times in {raw}; pass replace_all=true to "
            "replace them all, or add surrounding context to make it unique"
        )
    return text.replace(old, new), count if replace_all else 1

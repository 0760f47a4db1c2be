"""The read, write and edit builtins."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relayq._tools import Tool, ToolContext
from relayq.builtins._common import (
    ToolFailure,
    opt_bool,
    opt_int,
    req_str,
    sync_builtin,
    truncate,
)
from relayq.builtins._config import BuiltinsConfig
from relayq.builtins._paths import base_of, display, resolve

__all__ = ["edit_tool", "read_text", "read_tool", "split_lines", "write_tool"]

_DEFAULT_LIMIT = 2000

_PATH_DOC = "Path relative to the working directory (an absolute path must lie inside it)."


def read_text(path: Path, shown: str) -> str:
    """A whole UTF-8 file, or a ToolFailure that says why it cannot be read as text."""
    if not path.exists():
        raise ToolFailure(f"file not found: {shown}")
    if path.is_dir():
        raise ToolFailure(f"{shown} is a directory, not a file; use glob to list its files")
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolFailure(
            f"{shown} is not UTF-8 text (invalid byte at offset {exc.start}); "
            "it is probably a binary file"
        ) from exc


def split_lines(text: str) -> list[str]:
    """Lines without their endings; a final newline does not start an empty line."""
    lines = text.splitlines(keepends=True)
    return [line.rstrip("\r\n") for line in _only_newline_breaks(lines)]


def _only_newline_breaks(lines: list[str]) -> list[str]:
    # str.splitlines also breaks at \f, \v, \x1c and \u2028; rejoin those so line
    # numbers match what editors and grep count (only \n, \r\n and \r end a line).
    out: list[str] = []
    carry = ""
    for line in lines:
        carry += line
        if carry.endswith(("\n", "\r")):
            out.append(carry)
            carry = ""
    if carry:
        out.append(carry)
    return out


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
    def read(args: dict[str, Any], ctx: ToolContext) -> str:
        raw = req_str(args, "path")
        offset = opt_int(args, "offset", 1, minimum=1)
        limit = opt_int(args, "limit", _DEFAULT_LIMIT, minimum=1)
        path = resolve(ctx, raw)
        lines = split_lines(read_text(path, raw))
        return truncate(_window(lines, offset, limit, raw), config.max_output_chars)

    return sync_builtin(
        "read",
        "Read a UTF-8 text file. Each line is shown as its 1-based line number, a tab "
        f"and the line. Shows {_DEFAULT_LIMIT} lines from the start unless offset and "
        "limit choose another window; says when the file continues past the window.",
        _READ_SCHEMA,
        read,
    )


def _window(lines: list[str], offset: int, limit: int, shown: str) -> str:
    total = len(lines)
    if total == 0:
        return f"({shown} is empty)"
    if offset > total:
        raise ToolFailure(f"offset {offset} is past the end of {shown}, which has {total} lines")
    end = min(offset - 1 + limit, total)
    body = "\n".join(f"{n:>6}\t{lines[n - 1]}" for n in range(offset, end + 1))
    if end < total:
        body += f"\n(showing lines {offset}-{end} of {total}; pass offset={end + 1} to read more)"
    return body


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
        path = resolve(ctx, raw)
        if path.is_dir():
            raise ToolFailure(f"{raw} is a directory, not a file")
        path.parent.mkdir(parents=True, exist_ok=True)
        data = content.encode("utf-8")
        path.write_bytes(data)
        return f"Wrote {len(data)} bytes to {display(base_of(ctx), path)}"

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
        path = resolve(ctx, raw)
        text = read_text(path, raw)
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
        path.write_bytes(text.replace(old, new).encode("utf-8"))
        made = count if replace_all else 1
        noun = "replacement" if made == 1 else "replacements"
        return f"Made {made} {noun} in {display(base_of(ctx), path)}"

    return sync_builtin(
        "edit",
        "Replace an exact string in a UTF-8 text file. old_string must match the file "
        "exactly (whitespace included) and occur once, unless replace_all is true. Read "
        "the file first so the text is copied exactly.",
        _EDIT_SCHEMA,
        edit,
    )

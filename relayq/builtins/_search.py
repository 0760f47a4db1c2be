"""The grep and glob builtins: walking a folder without leaving the base directory.

Patterns are matched with the `regex` package, which releases the GIL while it
matches and stops at a deadline, so a pattern that backtracks catastrophically
(`(a|a)+$`) neither freezes the worker's event loop nor runs forever.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
from collections.abc import Generator, Iterator
from typing import Any

import regex

from relayq._tools import Tool, ToolContext
from relayq.builtins._common import (
    Deadline,
    ToolFailure,
    opt_str,
    req_str,
    sync_builtin,
    truncate,
)
from relayq.builtins._config import BuiltinsConfig
from relayq.builtins._fileio import Missing
from relayq.builtins._files import split_lines
from relayq.builtins._paths import locate, open_base
from relayq.builtins._walk import Found, Walker

__all__ = ["glob_regex", "glob_tool", "grep_tool"]

MAX_MATCHES = 500
MAX_FILES = 1000
# Bigger files are almost never source the model wants to grep, and reading
# them whole would stall the call.
_MAX_GREP_BYTES = 10 * 1024 * 1024
_MAX_LINE_CHARS = 500
_CHUNK = 1024 * 1024


@contextlib.contextmanager
def _search_files(
    ctx: ToolContext, args: dict[str, Any], deadline: Deadline, *, folder: bool = False
) -> Iterator[tuple[Walker, Generator[Found, None, None]]]:
    """A walker and the files under the `path` argument (default: the whole base)."""
    raw = opt_str(args, "path")
    with open_base(ctx) as base, locate(base, raw or ".") as root:
        walker = Walker(base, deadline)
        try:
            is_folder = walker.is_folder(root)
        except Missing as exc:
            raise ToolFailure(f"path not found: {raw}") from exc
        if folder and not is_folder:
            raise ToolFailure(f"{raw} is not a folder")
        files = walker.files(root)
        try:
            yield walker, files
        finally:
            files.close()  # a grep that stopped early leaves folders open otherwise


def _with_notes(out: str, walker: Walker) -> str:
    return "\n".join([out, *walker.notes])


# -- grep --------------------------------------------------------------------

_GREP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "pattern": {
            "type": "string",
            "description": "A Python regular expression, matched against each line.",
        },
        "path": {
            "type": "string",
            "description": "File or folder to search, relative to the working directory. "
            "Default: the whole working directory.",
        },
        "include": {
            "type": "string",
            "description": "Only search files whose name matches this glob, e.g. '*.py'.",
        },
    },
    "required": ["pattern"],
    "additionalProperties": False,
}


def grep_tool(config: BuiltinsConfig) -> Tool:
    seconds = config.file_timeout.total_seconds()

    def grep(args: dict[str, Any], ctx: ToolContext) -> str:
        pattern = req_str(args, "pattern")
        include = opt_str(args, "include")
        try:
            compiled = regex.compile(pattern)
        except regex.error as exc:
            raise ToolFailure(f"invalid regex {pattern!r}: {exc}") from exc
        deadline = Deadline(seconds, "grep")
        with _search_files(ctx, args, deadline) as (walker, files):
            hits, capped = _grep_files(walker, files, _Matcher(compiled, deadline), include)
        if not hits:
            return _with_notes(f"No matches for {pattern!r}.", walker)
        out = "\n".join(hits)
        if capped:
            out += f"\n(stopped at {MAX_MATCHES} matches; narrow the pattern, path or include)"
        return truncate(_with_notes(out, walker), config.max_output_chars)

    return sync_builtin(
        "grep",
        "Search file contents with a Python regular expression. Prints matching lines as "
        "'file:line:text', sorted by file then line; file paths are relative to the working "
        "directory. Skips .git folders and binary files. Use include to filter by file name.",
        _GREP_SCHEMA,
        grep,
    )


class _Matcher:
    """Searches lines within the deadline, releasing the GIL while it matches."""

    def __init__(self, compiled: regex.Pattern[str], deadline: Deadline) -> None:
        self.compiled = compiled
        self.deadline = deadline

    def __call__(self, line: str) -> bool:
        left = self.deadline.left()
        if left <= 0:
            raise self._slow()
        try:
            return self.compiled.search(line, timeout=left, concurrent=True) is not None
        except TimeoutError as exc:
            raise self._slow() from exc

    def _slow(self) -> ToolFailure:
        return self.deadline.expired(
            f": the pattern {self.compiled.pattern!r} took too long to match (nested "
            "repetitions such as (a+)+ or (a|a)+ can backtrack without end); simplify it, "
            "or narrow the path or include"
        )


def _grep_files(
    walker: Walker, files: Iterator[Found], matches: _Matcher, include: str | None
) -> tuple[list[str], bool]:
    hits: list[str] = []
    for found in files:
        if include is not None and not fnmatch.fnmatchcase(found.name, include):
            continue
        for number, line in _text_lines(walker, found):
            if matches(line):
                if len(hits) == MAX_MATCHES:
                    return hits, True
                hits.append(f"{found.shown}:{number}:{_clip(line)}")
    return hits, False


def _text_lines(walker: Walker, found: Found) -> Iterator[tuple[int, str]]:
    fd = walker.open(found)
    if fd is None:
        return
    try:
        if os.fstat(fd).st_size > _MAX_GREP_BYTES:
            return
        data = _read(fd, walker.deadline)
    except OSError:
        return  # unreadable files are skipped, as grep -s does
    finally:
        os.close(fd)
    if b"\0" in data:
        return
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return
    yield from enumerate(split_lines(text), start=1)


def _read(fd: int, deadline: Deadline) -> bytes:
    parts: list[bytes] = []
    while chunk := os.read(fd, _CHUNK):
        deadline.check()
        parts.append(chunk)
    return b"".join(parts)


def _clip(line: str) -> str:
    if len(line) <= _MAX_LINE_CHARS:
        return line
    return line[:_MAX_LINE_CHARS] + f"... [{len(line) - _MAX_LINE_CHARS} more characters]"


# -- glob --------------------------------------------------------------------

_GLOB_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "pattern": {
            "type": "string",
            "description": "Glob relative to path: '*' and '?' stay within one folder, "
            "'**' spans any number of folders, e.g. '**/*.py' or 'src/*.ts'.",
        },
        "path": {
            "type": "string",
            "description": "Folder to search, relative to the working directory. "
            "Default: the working directory.",
        },
    },
    "required": ["pattern"],
    "additionalProperties": False,
}


def glob_tool(config: BuiltinsConfig) -> Tool:
    seconds = config.file_timeout.total_seconds()

    def glob(args: dict[str, Any], ctx: ToolContext) -> str:
        pattern = req_str(args, "pattern")
        compiled = glob_regex(pattern)
        deadline = Deadline(seconds, "glob")
        with _search_files(ctx, args, deadline, folder=True) as (walker, files):
            found = [f.shown for f in files if _glob_match(compiled, f.rel, deadline)]
        if not found:
            return _with_notes(f"No files match {pattern!r}.", walker)
        out = "\n".join(found[:MAX_FILES])
        if len(found) > MAX_FILES:
            out += f"\n(showing {MAX_FILES} of {len(found)} files; narrow the pattern)"
        return truncate(_with_notes(out, walker), config.max_output_chars)

    return sync_builtin(
        "glob",
        "List the files whose path matches a glob pattern, sorted, relative to the working "
        "directory. Supports '**' for any depth. Skips .git folders.",
        _GLOB_SCHEMA,
        glob,
    )


def _glob_match(compiled: regex.Pattern[str], rel: str, deadline: Deadline) -> bool:
    try:
        return compiled.fullmatch(rel, timeout=max(deadline.left(), 1e-3)) is not None
    except TimeoutError as exc:
        raise deadline.expired(": the pattern took too long to match; simplify it") from exc


def glob_regex(pattern: str) -> regex.Pattern[str]:
    """A regex matching the `/`-separated relative paths that `pattern` selects."""
    pattern = pattern.removeprefix("./")
    if pattern.startswith("/") or ".." in pattern.split("/"):
        raise ToolFailure("the glob pattern must be relative and must not contain '..'")
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")  # zero or more whole folders
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[":
            i = _char_class(pattern, i, out)
        else:
            out.append(regex.escape(pattern[i]))
            i += 1
    return regex.compile("".join(out), regex.DOTALL)


def _char_class(pattern: str, start: int, out: list[str]) -> int:
    end = pattern.find(
        "]", start + 2 if pattern[start + 1 : start + 2] in ("!", "]") else start + 1
    )
    if end == -1:
        out.append(regex.escape("["))
        return start + 1
    body = pattern[start + 1 : end]
    if body.startswith("!"):
        body = "^" + body[1:]
    out.append("[" + body.replace("\\", "\\\\") + "]")
    return end + 1

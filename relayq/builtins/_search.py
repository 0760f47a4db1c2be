"""The grep and glob builtins: walking a folder without leaving the base directory."""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from relayq._tools import Tool, ToolContext
from relayq.builtins._common import ToolFailure, opt_str, req_str, sync_builtin, truncate
from relayq.builtins._config import BuiltinsConfig
from relayq.builtins._files import split_lines
from relayq.builtins._paths import base_of, display, inside, resolve

__all__ = ["glob_regex", "glob_tool", "grep_tool"]

MAX_MATCHES = 500
MAX_FILES = 1000
# Bigger files are almost never source the model wants to grep, and reading
# them whole would stall the call.
_MAX_GREP_BYTES = 10 * 1024 * 1024
_MAX_LINE_CHARS = 500
_SKIPPED_DIRS = frozenset({".git"})


def _walk(base: Path, root: Path) -> Iterator[Path]:
    """Files under `root`, without `.git` folders or anything resolving outside `base`.

    Symlinked folders are not descended into (os.walk's default), and a symlinked
    file is only kept when its target is inside the base directory.
    """
    if root.is_file():
        yield root
        return
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in _SKIPPED_DIRS]
        for name in files:
            path = Path(folder, name)
            if path.is_symlink():
                target = path.resolve()
                if not inside(base, target) or not target.is_file():
                    continue
            yield path


def _sorted_files(base: Path, root: Path) -> list[tuple[str, Path]]:
    # `root` is resolved and the walk follows no symlinked folder, so every path
    # lies under `base` as written; a symlinked file is shown where it sits.
    files = [(display(base, p), p) for p in _walk(base, root)]
    files.sort(key=lambda item: item[0])
    return files


def _search_root(ctx: ToolContext, args: dict[str, Any]) -> tuple[Path, Path]:
    base = base_of(ctx)
    raw = opt_str(args, "path")
    if raw is None:
        return base, base
    root = resolve(ctx, raw)
    if not root.exists():
        raise ToolFailure(f"path not found: {raw}")
    return base, root


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
    def grep(args: dict[str, Any], ctx: ToolContext) -> str:
        pattern = req_str(args, "pattern")
        include = opt_str(args, "include")
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise ToolFailure(f"invalid regex {pattern!r}: {exc}") from exc
        base, root = _search_root(ctx, args)
        hits, capped = _grep_files(base, root, regex, include)
        if not hits:
            return f"No matches for {pattern!r}."
        out = "\n".join(hits)
        if capped:
            out += f"\n(stopped at {MAX_MATCHES} matches; narrow the pattern, path or include)"
        return truncate(out, config.max_output_chars)

    return sync_builtin(
        "grep",
        "Search file contents with a Python regular expression. Prints matching lines as "
        "'file:line:text', sorted by file then line; file paths are relative to the working "
        "directory. Skips .git folders and binary files. Use include to filter by file name.",
        _GREP_SCHEMA,
        grep,
    )


def _grep_files(
    base: Path, root: Path, regex: re.Pattern[str], include: str | None
) -> tuple[list[str], bool]:
    hits: list[str] = []
    for shown, path in _sorted_files(base, root):
        if include is not None and not fnmatch.fnmatchcase(path.name, include):
            continue
        for number, line in _text_lines(path):
            if regex.search(line):
                if len(hits) == MAX_MATCHES:
                    return hits, True
                hits.append(f"{shown}:{number}:{_clip(line)}")
    return hits, False


def _text_lines(path: Path) -> Iterator[tuple[int, str]]:
    try:
        if path.stat().st_size > _MAX_GREP_BYTES:
            return
        data = path.read_bytes()
    except OSError:
        return  # unreadable files are skipped, as grep -s does
    if b"\0" in data:
        return
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return
    yield from enumerate(split_lines(text), start=1)


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
    def glob(args: dict[str, Any], ctx: ToolContext) -> str:
        pattern = req_str(args, "pattern")
        base, root = _search_root(ctx, args)
        if not root.is_dir():
            raise ToolFailure(f"{args['path']} is not a folder")
        regex = glob_regex(pattern)
        found: list[str] = []
        for shown, path in _sorted_files(base, root):
            if regex.fullmatch(path.relative_to(root).as_posix()):
                found.append(shown)
        if not found:
            return f"No files match {pattern!r}."
        out = "\n".join(found[:MAX_FILES])
        if len(found) > MAX_FILES:
            out += f"\n(showing {MAX_FILES} of {len(found)} files; narrow the pattern)"
        return truncate(out, config.max_output_chars)

    return sync_builtin(
        "glob",
        "List the files whose path matches a glob pattern, sorted, relative to the working "
        "directory. Supports '**' for any depth. Skips .git folders.",
        _GLOB_SCHEMA,
        glob,
    )


def glob_regex(pattern: str) -> re.Pattern[str]:
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
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out), re.DOTALL)


def _char_class(pattern: str, start: int, out: list[str]) -> int:
    end = pattern.find(
        "]", start + 2 if pattern[start + 1 : start + 2] in ("!", "]") else start + 1
    )
    if end == -1:
        out.append(re.escape("["))
        return start + 1
    body = pattern[start + 1 : end]
    if body.startswith("!"):
        body = "^" + body[1:]
    out.append("[" + body.replace("\\", "\\\\") + "]")
    return end + 1

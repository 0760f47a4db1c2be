"""What every builtin shares: clean failures, off-loop work, argument checks, output cuts."""

from __future__ import annotations

import asyncio
import codecs
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

from relayq._errors import RelayqError
from relayq._tools import Tool, ToolContext, define_tool
from relayq._types import Request, ToolResult

__all__ = [
    "AsyncFn",
    "Deadline",
    "Output",
    "OutputSink",
    "SyncFn",
    "ToolFailure",
    "async_builtin",
    "opt_bool",
    "opt_int",
    "opt_seconds",
    "opt_str",
    "req_str",
    "sync_builtin",
    "truncate",
]

Output: TypeAlias = str | ToolResult | Request
SyncFn: TypeAlias = Callable[[dict[str, Any], ToolContext], Output]
AsyncFn: TypeAlias = Callable[[dict[str, Any], ToolContext], Awaitable[Output]]


class ToolFailure(RelayqError):
    """An expected failure whose message is written for the model to read; a builtin
    turns it into an error result, so it never leaves the tool."""


class Deadline:
    """A point in time that blocking work checks between its steps."""

    def __init__(self, seconds: float, what: str) -> None:
        self.seconds = seconds
        self.what = what
        self._end = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self._end - time.monotonic())

    def check(self) -> None:
        if time.monotonic() >= self._end:
            raise self.expired()

    def expired(self, why: str = "") -> ToolFailure:
        return ToolFailure(f"{self.what} gave up after {self.seconds:g} s{why}")


def sync_builtin(name: str, description: str, schema: dict[str, Any], fn: SyncFn) -> Tool:
    """A tool that checks its arguments and turns expected failures into error results.

    `fn` runs in a worker thread, whoever calls the tool: file and CPU work must
    never hold up the event loop, where every other turn of the worker runs.
    """

    def run_sync(args: dict[str, Any], ctx: ToolContext) -> Output:
        try:
            _check_args(name, schema, args)
            return fn(args, ctx)
        except ToolFailure as exc:
            return ToolResult.error(str(exc))
        except OSError as exc:
            return ToolResult.error(_os_message(exc))

    async def run(args: dict[str, Any], ctx: ToolContext) -> Output:
        return await asyncio.to_thread(run_sync, args, ctx)

    return define_tool(name, description, schema, run)


def async_builtin(name: str, description: str, schema: dict[str, Any], fn: AsyncFn) -> Tool:
    """The async twin of `sync_builtin`: stays a coroutine so it runs on the loop."""

    async def run(args: dict[str, Any], ctx: ToolContext) -> Output:
        try:
            _check_args(name, schema, args)
            return await fn(args, ctx)
        except ToolFailure as exc:
            return ToolResult.error(str(exc))
        except OSError as exc:
            return ToolResult.error(_os_message(exc))

    return define_tool(name, description, schema, run)


def _check_args(name: str, schema: dict[str, Any], args: object) -> None:
    # The loop hands over whatever the model sent; the schema is only advice to it.
    if not isinstance(args, dict):
        raise ToolFailure(f"{name}: the arguments must be a JSON object")
    known = schema.get("properties", {})
    unknown = sorted(k for k in args if k not in known)
    if unknown:
        raise ToolFailure(
            f"{name}: unknown argument(s) {', '.join(unknown)}; "
            f"expected {', '.join(known) or 'none'}"
        )
    missing = [k for k in schema.get("required", []) if k not in args]
    if missing:
        raise ToolFailure(f"{name}: missing required argument(s) {', '.join(missing)}")


def _os_message(exc: OSError) -> str:
    reason = exc.strerror or str(exc)
    return f"{reason}: {exc.filename}" if exc.filename else reason


# -- arguments ---------------------------------------------------------------


def req_str(args: dict[str, Any], key: str, *, allow_empty: bool = False) -> str:
    value = args.get(key)
    if not isinstance(value, str):
        raise ToolFailure(f"argument {key!r} must be a string")
    if not allow_empty and value == "":
        raise ToolFailure(f"argument {key!r} must not be empty")
    return value


def opt_str(args: dict[str, Any], key: str) -> str | None:
    if args.get(key) is None:
        return None
    return req_str(args, key)


def opt_int(args: dict[str, Any], key: str, default: int, *, minimum: int) -> int:
    value = args.get(key)
    if value is None:
        return default
    # bool is an int subclass, but `true` is never a meaningful line number.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ToolFailure(f"argument {key!r} must be an integer")
    if value < minimum:
        raise ToolFailure(f"argument {key!r} must be at least {minimum}, got {value}")
    return value


def opt_bool(args: dict[str, Any], key: str, default: bool) -> bool:
    value = args.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ToolFailure(f"argument {key!r} must be true or false")
    return value


def opt_seconds(args: dict[str, Any], key: str, limit: float) -> float:
    """A timeout the model may shorten but never lengthen past the configured `limit`."""
    value = args.get(key)
    if value is None:
        return limit
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ToolFailure(f"argument {key!r} must be a positive number of seconds")
    return min(float(value), limit)


# -- output ------------------------------------------------------------------


def _cut_note(shown: int, total: int) -> str:
    return f"\n[output cut: {total - shown} of {total} characters not shown]"


def truncate(text: str, limit: int) -> str:
    """`text`, or its first `limit` characters and a note saying how much was cut."""
    if len(text) <= limit:
        return text
    return text[:limit] + _cut_note(limit, len(text))


class OutputSink:
    """Decodes a byte stream, keeps the first `limit` characters and counts the rest.

    Streams are read to their end without holding more than `limit` characters,
    so a command printing gigabytes cannot exhaust memory.
    """

    def __init__(self, limit: int, encoding: str = "utf-8") -> None:
        self._limit = limit
        self._decoder = codecs.getincrementaldecoder(encoding)("replace")
        self._parts: list[str] = []
        self._kept = 0
        self._total = 0

    def feed(self, data: bytes, *, final: bool = False) -> None:
        self.add(self._decoder.decode(data, final))

    def add(self, text: str) -> None:
        """Keep already decoded text, as `feed` keeps bytes."""
        self._total += len(text)
        room = self._limit - self._kept
        if room > 0 and text:
            piece = text[:room]
            self._parts.append(piece)
            self._kept += len(piece)

    def text(self) -> str:
        """What was kept, with a cut note when the stream was longer."""
        self.feed(b"", final=True)
        kept = "".join(self._parts)
        if self._total > self._kept:
            return kept + _cut_note(self._kept, self._total)
        return kept

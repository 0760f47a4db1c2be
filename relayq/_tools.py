"""Tools: a name, a description, a JSON schema and, unless relayed, a function."""

from __future__ import annotations

import asyncio
import inspect
import math
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from relayq._errors import ToolkitError
from relayq._types import Answer, Request, ToolResult
from relayq.policies import Gatekeeper

__all__ = ["Tool", "ToolContext", "ToolFn", "define_tool", "tool"]

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}

ToolOutput: TypeAlias = "str | ToolResult | Request"
ToolFn: TypeAlias = Callable[[dict[str, Any], "ToolContext"], "ToolOutput | Awaitable[ToolOutput]"]


@dataclass(frozen=True, kw_only=True)
class ToolContext:
    """What a tool knows about the call it is serving."""

    run_id: str
    """The run this call belongs to."""
    call_id: str
    """The provider's id for this call."""
    tool_name: str
    base_dir: Path
    """File tools stay inside this folder."""
    answer: Answer | None = None
    """The host's answer when the tool is called again after returning `pending(...)`."""
    turn: int = 1
    """The run's turn (1 for the first model reply) whose reply made this call."""
    attempt: int = 1
    """1 on the call's first execution; 1 more each time it runs again because a worker
    died (or lost its claim) before its result was recorded. Above 1, an earlier
    execution may have done its side effect: check `idempotency_key` before doing it again."""
    agent: str = ""
    """The agent whose run made the call ("" in-process)."""
    conversation_id: str | None = None
    started_by: str | None = None
    """Who started the run: a token's name, `cli:<os user>`; None where nobody said."""
    gatekeeper: Gatekeeper = field(default_factory=Gatekeeper)
    """Where an approval policy's outcomes are kept and its grants are found
    (`relayq.policies`)."""

    @property
    def idempotency_key(self) -> str:
        """`run_id:turn:call_id`: one per tool call of the whole run (providers reuse call
        ids across turns), the same on every attempt of that call."""
        return f"{self.run_id}:{self.turn}:{self.call_id}"


@dataclass(frozen=True, kw_only=True)
class Tool:
    """A tool the model may call. `fn is None` marks a relay tool, run by the host."""

    name: str
    description: str
    schema: dict[str, Any] = field(default_factory=lambda: dict(_EMPTY_SCHEMA))
    fn: ToolFn | None = None
    timeout: float | None = None
    """Seconds a call may take before it is given up on, its result an error that says
    so; None: the agent's `tool_timeout`, else only the turn's time limit bounds it."""

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ToolkitError(
                f"tool name {self.name!r} must be 1-64 letters, digits, '_' or '-'", self.name
            )
        _check_timeout(self.timeout, f"tool {self.name!r}")
        if not isinstance(self.schema, dict) or self.schema.get("type", "object") != "object":
            raise ToolkitError(
                f"tool {self.name!r}: the schema must be a JSON schema of type 'object'",
                self.name,
            )

    @property
    def is_relay(self) -> bool:
        return self.fn is None

    async def invoke(
        self, args: dict[str, Any], ctx: ToolContext, *, timeout: float | None = None
    ) -> ToolResult | Request:
        """Run the tool; a raised exception becomes an error result, never escapes, and
        so does a call past its `timeout` (the tool's own, else this one)."""
        if self.fn is None:
            raise ToolkitError(f"relay tool {self.name!r} has no behaviour to invoke", self.name)
        limit = self.timeout if self.timeout is not None else timeout
        bound = asyncio.timeout(limit)
        try:
            async with bound:
                if inspect.iscoroutinefunction(self.fn):
                    out = await self.fn(args, ctx)
                else:
                    # Sync tools run in a thread so that a turn's calls overlap, and so that
                    # they never hold the loop.
                    out = await asyncio.to_thread(self.fn, args, ctx)
                    if inspect.isawaitable(out):
                        out = await out
        except Exception as exc:
            if bound.expired():
                # An async call was cancelled; a sync one's thread is left to end alone.
                return ToolResult.error(
                    f"the tool {self.name!r} did not return within {limit:g} s and was "
                    "given up on; what it was doing may still complete"
                )
            return ToolResult.error(f"{type(exc).__name__}: {exc}")
        return _as_output(out, self.name)


def _check_timeout(seconds: float | None, what: str) -> None:
    if seconds is None:
        return
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not 0 < seconds < math.inf
    ):
        raise ToolkitError(f"{what}: timeout must be a positive number of seconds, not {seconds!r}")


def _as_output(out: object, name: str) -> ToolResult | Request:
    if isinstance(out, ToolResult | Request):
        return out
    if isinstance(out, str):
        return ToolResult(output=out)
    return ToolResult.error(
        f"tool {name!r} returned {type(out).__name__}; expected str, ToolResult or pending(...)"
    )


def define_tool(
    name: str,
    description: str,
    schema: dict[str, Any] | None,
    fn: ToolFn,
    *,
    timeout: float | None = None,
) -> Tool:
    """A tool from a JSON schema and a function `fn(args, ctx)`, sync or async; `timeout`
    bounds each call (`Tool.timeout`)."""
    return Tool(
        name=name,
        description=description,
        schema=schema or dict(_EMPTY_SCHEMA),
        fn=fn,
        timeout=timeout,
    )


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(
    *, name: str | None = None, description: str | None = None, timeout: float | None = None
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a tool of a typed function; the schema comes from its type hints.

        @tool
        def add(a: int, b: int) -> str:
            "Add two numbers."
            return str(a + b)

    A parameter annotated `ToolContext` receives the call's context and is left
    out of the schema. Arguments are validated before the function runs; invalid
    ones give the model an error result that says what is wrong. `timeout` bounds
    each call in seconds (`Tool.timeout`).
    """

    def build(f: Callable[..., Any]) -> Tool:
        return _tool_from_function(f, name=name, description=description, timeout=timeout)

    return build(fn) if fn is not None else build


def _tool_from_function(
    f: Callable[..., Any], *, name: str | None, description: str | None, timeout: float | None
) -> Tool:
    hints = get_type_hints(f)
    fields: dict[str, Any] = {}
    ctx_param: str | None = None
    for param in inspect.signature(f).parameters.values():
        hint = hints.get(param.name, Any)
        if hint is ToolContext:
            ctx_param = param.name
            continue
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (hint, default)
    tool_name = name or f.__name__
    model = create_model(f"{tool_name}_args", __config__=ConfigDict(extra="forbid"), **fields)
    schema = model.model_json_schema()
    schema.pop("title", None)
    is_async = inspect.iscoroutinefunction(f)

    async def call(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        try:
            parsed: BaseModel = model.model_validate(args)
        except ValidationError as exc:
            return ToolResult.error(f"invalid arguments for {tool_name}: {_brief(exc)}")
        kwargs = {k: getattr(parsed, k) for k in fields}
        if ctx_param is not None:
            kwargs[ctx_param] = ctx
        if is_async:
            out: ToolOutput = await f(**kwargs)
            return out
        result: ToolOutput = await asyncio.to_thread(f, **kwargs)
        return result

    doc = inspect.getdoc(f) or ""
    return Tool(
        name=tool_name, description=description or doc, schema=schema, fn=call, timeout=timeout
    )


def _brief(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(p) for p in err["loc"]) or "arguments"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)

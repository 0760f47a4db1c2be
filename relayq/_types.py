"""The data that crosses process boundaries: requests, answers, results.

Every model here serialises to camelCase JSON with
`model_dump(mode="json", by_alias=True)` and reads back from it, so the same
shape travels through the store, the broker and the HTTP API.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from relayq.wire import CamelModel

__all__ = [
    "Answer",
    "Request",
    "RunResult",
    "RunStatus",
    "ToolCallRecord",
    "ToolResult",
    "Usage",
    "new_id",
    "pending",
]

RunStatus = Literal[
    "done", "pending", "incomplete", "queued", "running", "failed", "cancelled", "over_budget"
]


def new_id(prefix: str) -> str:
    """A fresh random id such as `req_5f0c...`; the prefix tells what it names."""
    return f"{prefix}_{uuid.uuid4().hex}"


class WireModel(CamelModel):
    model_config = ConfigDict(frozen=True)


class Request(WireModel):
    """What a suspended run asks of its host: approve this, answer that, run these calls.

    Wire shape: `{id, kind, prompt, url?, data, expiresAt?}`.
    """

    id: str = Field(default_factory=lambda: new_id("req"))
    """Echoed back by the answer; an answer with another id is refused."""
    kind: str
    """What is asked: `tool_call` (relay calls), `approval`, `question`, or a tool's own kind."""
    prompt: str
    """One line a person can read to know what is asked."""
    url: str | None = None
    """Where the host can act on the request, if anywhere."""
    data: dict[str, Any] = Field(default_factory=dict)
    """Kind-specific payload; relay requests carry `calls` here."""
    expires_at: datetime | None = None
    """After this instant an answer is refused."""

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        for key in ("url", "expiresAt", "expires_at"):
            if key in out and out[key] is None:
                del out[key]
        return out


class Answer(WireModel):
    """The host's reply to one Request. Wire shape: `{id, ok, data?, reason?}`.

    Parsed strictly, the same for the Python client, the CLI and the HTTP API:
    `ok` and every `isError` must be booleans (`"yes"` is refused, not read as
    true), `id` and `reason` strings, `data` an object.
    """

    model_config = ConfigDict(strict=True)

    id: str
    """The id of the Request this answers."""
    ok: bool = True
    """False declines the request: every call it covers gets an error result carrying `reason`."""
    data: dict[str, Any] | None = None
    """Kind-specific payload; relay answers carry `results` or the `output` shorthand."""
    reason: str | None = None
    """Why the request was declined."""

    @model_validator(mode="after")
    def _flags_are_booleans(self) -> Answer:
        data = self.data or {}
        places: list[tuple[str, Any]] = [("data", data)]
        if isinstance(data.get("results"), list):
            places += [(f"data.results[{n}]", r) for n, r in enumerate(data["results"])]
        for where, item in places:
            for key in ("isError", "is_error"):
                if isinstance(item, dict) and key in item and not isinstance(item[key], bool):
                    given = repr(item[key])[:40]
                    raise ValueError(f"{where}.{key} must be true or false, not {given}")
        return self

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        for key in ("data", "reason"):
            if out.get(key) is None:
                out.pop(key, None)
        return out


class ToolResult(WireModel):
    """What one tool call produced. Wire shape: `{output, isError}`."""

    output: str
    is_error: bool = False

    @classmethod
    def error(cls, message: str) -> ToolResult:
        return cls(output=message, is_error=True)


class Usage(WireModel):
    """Tokens spent on model calls."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
        )


class ToolCallRecord(WireModel):
    """One tool call of a run and the result it ended with."""

    id: str
    """The provider's call id."""
    name: str
    arguments: str
    """The arguments exactly as the model sent them: a JSON string."""
    output: str
    is_error: bool = False


class RunResult(WireModel):
    """How a run ended, or where it halted."""

    status: RunStatus
    """`done`: the model gave its final text; `pending`: halted on `pending`;
    `incomplete`: stopped by `max_turns`. Durable runs may also be `queued`,
    `running`, `failed` (see `error`) or `cancelled`."""
    text: str = ""
    """The model's final text (empty unless `done`)."""
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    """Every resolved tool call since the run's prompt, in call order."""
    messages: list[dict[str, Any]] = Field(default_factory=list)
    """The whole transcript, JSON-serialisable; pass it back to resume."""
    pending: Request | None = None
    """The request the run waits on when `status == "pending"`."""
    turns: int = 0
    """Model calls since the run's prompt."""
    usage: Usage = Field(default_factory=Usage)
    run_id: str | None = None
    error: str | None = None
    """Why a durable run failed."""


def pending(
    kind: str,
    prompt: str,
    data: dict[str, Any] | None = None,
    *,
    url: str | None = None,
    expires_in: timedelta | None = None,
) -> Request:
    """Suspend the calling tool until the host answers.

    A tool returns this instead of a result; the run halts with the Request, and
    once answered the tool is called again with `ctx.answer` set:

        def deploy(args, ctx):
            if ctx.answer is None:
                return pending("approval", f"Deploy {args['service']}?")
            return "deployed"
    """
    expires_at = datetime.now(UTC) + expires_in if expires_in is not None else None
    return Request(kind=kind, prompt=prompt, data=data or {}, url=url, expires_at=expires_at)

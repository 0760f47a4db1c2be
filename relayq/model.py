"""What the loop asks of a model, and how a plain `generate` function answers.

A model is any async callable from `InProcessRequest` to `InProcessResponse`.
`as_model` lifts a user's `generate` (sync or async) to that shape; the real
providers implement it directly.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

from pydantic import Field, SkipValidation
from pydantic.dataclasses import dataclass

from relayq._types import Usage

__all__ = ["Generate", "InProcessRequest", "InProcessResponse", "InProcessToolCall", "Model"]


@dataclass(frozen=True)
class InProcessToolCall:
    """A tool call the model makes. `arguments` may be a dict or a raw JSON string."""

    id: str
    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)


@dataclass(frozen=True)
class InProcessResponse:
    """The model's reply: text, tool calls, or both."""

    content: str = ""
    tool_calls: list[InProcessToolCall] = Field(default_factory=list)
    usage: Usage | None = None


@dataclass(frozen=True)
class InProcessRequest:
    """What the model is asked: the transcript in OpenAI chat shape and the tools.

    Its lists are neither checked nor copied when it is built: the loop builds it from
    the run's own transcript, and walking a conversation of 800 turns at every turn
    would make each turn cost more than the last. A `generate` function is given a
    copy of its own (`as_model`); the providers only read it.
    """

    messages: SkipValidation[list[dict[str, Any]]]
    """Chat messages, the system prompt first when there is one."""
    tools: SkipValidation[list[dict[str, Any]]]
    """Tools in OpenAI function shape."""
    model: str = "in-process"
    transcript: SkipValidation[list[dict[str, Any]]] = Field(default_factory=list)
    """The same messages with relayq's notes kept (a tool result's error flag, ...),
    for providers whose wire format has room for them."""


Model: TypeAlias = Callable[[InProcessRequest], Awaitable[InProcessResponse]]
Generate: TypeAlias = Callable[
    [InProcessRequest], "InProcessResponse | Awaitable[InProcessResponse]"
]


def as_model(generate: Generate) -> Model:
    """An async model from a sync or async `generate`; sync ones run in a thread.

    `generate` gets a deep copy of the request: whatever it changes in it, the run's
    transcript stays as it was.
    """

    async def model(request: InProcessRequest) -> InProcessResponse:
        messages, tools, transcript = copy.deepcopy(
            (request.messages, request.tools, request.transcript)
        )
        request = InProcessRequest(
            messages=messages, tools=tools, model=request.model, transcript=transcript
        )
        if inspect.iscoroutinefunction(generate):
            out = await generate(request)
        else:
            out = await asyncio.to_thread(generate, request)
            if inspect.isawaitable(out):
                out = await out
        if not isinstance(out, InProcessResponse):
            raise TypeError(f"generate returned {type(out).__name__}, expected InProcessResponse")
        return out

    return model

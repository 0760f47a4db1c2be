"""Scripted models for the core tests: deterministic, and they count their calls."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from relayq import InProcessRequest, InProcessResponse, InProcessToolCall


def call(id: str, name: str, arguments: dict[str, Any] | str | None = None) -> InProcessToolCall:
    return InProcessToolCall(id=id, name=name, arguments={} if arguments is None else arguments)


def calls(*pairs: tuple[str, str]) -> InProcessResponse:
    return InProcessResponse(tool_calls=[call(i, n) for i, n in pairs])


def text(content: str) -> InProcessResponse:
    return InProcessResponse(content=content)


def tool_messages(req: InProcessRequest) -> list[dict[str, Any]]:
    return [m for m in req.messages if m["role"] == "tool"]


@dataclass
class Script:
    """A model that answers its n-th call with `replies[n]`, or a function of the request."""

    replies: list[InProcessResponse | Callable[[InProcessRequest], InProcessResponse]]
    seen: list[InProcessRequest] = field(default_factory=list)

    def __call__(self, req: InProcessRequest) -> InProcessResponse:
        self.seen.append(req)
        reply = self.replies[min(len(self.seen), len(self.replies)) - 1]
        return reply(req) if callable(reply) else reply

    @property
    def calls(self) -> int:
        return len(self.seen)


def echo_tool_outputs(req: InProcessRequest) -> InProcessResponse:
    """The final reply of many tests: every tool output so far, joined by commas."""
    return text(",".join(str(m["content"]) for m in tool_messages(req)))

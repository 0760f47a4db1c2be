"""What both wire dialects share: a decoded reply and the tool-choice spelling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from relayq.model import InProcessResponse

__all__ = ["FinishReason", "Reply", "ToolChoice", "named_tool"]

FinishReason = Literal["tool_calls", "stop", "length", "content_filter"]

ToolChoice: TypeAlias = "Literal['auto', 'none', 'required'] | dict[str, Any] | None"
"""`auto`, `none`, `required`, or a named tool: `{"type": "function", "function": {"name": ...}}`
(OpenAI's spelling) or `{"name": ...}`."""


@dataclass(frozen=True, kw_only=True)
class Reply:
    response: InProcessResponse
    finish_reason: FinishReason
    model: str


def named_tool(choice: dict[str, Any]) -> str:
    name = choice.get("name") or (choice.get("function") or {}).get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"tool_choice {choice!r} names no tool")
    return name

"""The OpenAI chat-completions dialect (OpenAI, OpenRouter, vLLM, Ollama, LiteLLM, ...)."""

from __future__ import annotations

from typing import Any

from relayq._types import Usage
from relayq.model import InProcessResponse, InProcessToolCall
from relayq.providers._fragments import Fragments, dumps
from relayq.providers._wire import FinishReason, Reply, ToolChoice, named_tool

__all__ = ["decode", "encode", "encode_json", "fragments", "path"]


def path(base_url: str) -> str:
    return base_url.rstrip("/") + "/chat/completions"


def headers(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def encode(
    *,
    model: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    system: str | None = None,
    tool_choice: ToolChoice = None,
    max_tokens: int | None = None,
) -> dict[str, Any]:
    """A chat-completions body; `messages` are chat-shaped already (notes stripped)."""
    wire = [_message(m) for m in messages]
    if system:
        wire = [{"role": "system", "content": system}, *wire]
    body: dict[str, Any] = {"model": model, "messages": wire}
    if tools:
        body["tools"] = tools
    if tool_choice is not None:
        body["tool_choice"] = _choice(tool_choice)
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


def fragments() -> Fragments:
    """A cache of messages' JSON in this dialect's wire form, for `encode_json`."""
    return Fragments(_message)


def encode_json(
    kept: Fragments,
    *,
    model: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    system: str | None = None,
    tool_choice: ToolChoice = None,
    max_tokens: int | None = None,
) -> str:
    """`encode`'s body as JSON text, each message's part taken from `kept` when it has
    been encoded before: the same text, at the cost of the new messages only."""
    head = dumps({"model": model})[:-1]
    wire = [kept.of(m) for m in messages]
    if system:
        wire.insert(0, dumps({"role": "system", "content": system}))
    rest = encode(
        model=model, messages=[], tools=tools, tool_choice=tool_choice, max_tokens=max_tokens
    )
    del rest["model"], rest["messages"]
    tail = "," + dumps(rest)[1:] if rest else "}"
    return f'{head},"messages":[{",".join(wire)}]{tail}'


def _message(m: dict[str, Any]) -> dict[str, Any]:
    if m.get("role") == "assistant":
        if m.get("tool_calls"):
            return {"role": "assistant", "content": m.get("content"), "tool_calls": m["tool_calls"]}
        # Content may be null only beside tool calls; an empty reply is "".
        return {"role": "assistant", "content": m.get("content") or ""}
    if m.get("role") == "tool":
        return {
            "role": "tool",
            "tool_call_id": m["tool_call_id"],
            "content": m.get("content") or "",
        }
    return {"role": m["role"], "content": m.get("content") or ""}


def _choice(choice: ToolChoice) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return choice
    assert choice is not None
    return {"type": "function", "function": {"name": named_tool(choice)}}


def decode(body: dict[str, Any]) -> Reply:
    """A reply from a chat-completions response; ValueError if it has no usable choice."""
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        raise ValueError("the response has no choices")
    message = choices[0].get("message") or {}
    calls = [
        InProcessToolCall(
            id=str(tc.get("id")),
            name=str((tc.get("function") or {}).get("name")),
            arguments=_arguments((tc.get("function") or {}).get("arguments")),
        )
        for tc in message.get("tool_calls") or []
    ]
    usage = body.get("usage") or {}
    return Reply(
        response=InProcessResponse(
            content=message.get("content") or "",
            tool_calls=calls,
            usage=Usage(
                prompt_tokens=int(usage.get("prompt_tokens") or 0),
                completion_tokens=int(usage.get("completion_tokens") or 0),
                total_tokens=int(usage.get("total_tokens") or 0),
            ),
        ),
        finish_reason=_finish(choices[0].get("finish_reason"), bool(calls)),
        model=str(body.get("model") or ""),
    )


def _arguments(raw: object) -> str | dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    return raw if isinstance(raw, str) else "{}"


def _finish(reason: object, has_calls: bool) -> FinishReason:
    if has_calls or reason in ("tool_calls", "function_call"):
        return "tool_calls"
    if reason == "length":
        return "length"
    if reason == "content_filter":
        return "content_filter"
    return "stop"

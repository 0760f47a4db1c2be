"""The Anthropic messages dialect.

The transcript is chat-shaped; Anthropic wants strictly alternating user and
assistant turns of content blocks. Tool calls become `tool_use` blocks; each
run of tool messages becomes ONE user turn of `tool_result` blocks, in call
order, with `is_error` kept from relayq's note on the message.
"""

from __future__ import annotations

import json
from typing import Any

from relayq import transcript as tx
from relayq._types import Usage
from relayq.model import InProcessResponse, InProcessToolCall
from relayq.providers._wire import FinishReason, Reply, ToolChoice, named_tool

__all__ = ["DEFAULT_MAX_TOKENS", "VERSION", "decode", "encode", "path"]

VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096


def path(base_url: str) -> str:
    base = base_url.rstrip("/")
    return f"{base}/messages" if base.endswith("/v1") else f"{base}/v1/messages"


def headers(key: str) -> dict[str, str]:
    return {"x-api-key": key, "anthropic-version": VERSION}


def encode(
    *,
    model: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    system: str | None = None,
    tool_choice: ToolChoice = None,
    max_tokens: int | None = None,
) -> dict[str, Any]:
    """A messages body from chat-shaped `messages` (notes kept: they carry `is_error`)."""
    systems = [str(m.get("content") or "") for m in messages if m.get("role") == "system"]
    turns: list[dict[str, Any]] = []
    for m in messages:
        if m.get("role") == "system":
            continue
        role = "assistant" if m.get("role") == "assistant" else "user"
        blocks = _blocks(m)
        if not blocks:
            continue  # an empty reply: Anthropic refuses empty content
        if turns and turns[-1]["role"] == role:
            # Consecutive tool results (and anything else of one role) merge into one turn.
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens or DEFAULT_MAX_TOKENS,
        "messages": turns,
    }
    prompt = "\n\n".join(p for p in [system or "", *systems] if p)
    if prompt:
        body["system"] = prompt
    if tools:
        body["tools"] = [_tool(t) for t in tools]
    if tool_choice is not None:
        body["tool_choice"] = _choice(tool_choice)
    return body


def _blocks(m: dict[str, Any]) -> list[dict[str, Any]]:
    if m.get("role") == "tool":
        block: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": m["tool_call_id"],
            "content": "".join(b["text"] for b in _text_blocks(m.get("content"))),
        }
        if (m.get(tx.NOTE) or {}).get("is_error"):
            block["is_error"] = True
        return [block]
    blocks = _text_blocks(m.get("content"))
    for call in tx.calls_of(m) if m.get("role") == "assistant" else []:
        blocks.append(
            {"type": "tool_use", "id": call.id, "name": call.name, "input": _input(call.arguments)}
        )
    return blocks


def _text_blocks(content: object) -> list[dict[str, Any]]:
    """Text blocks from chat content: a string, or OpenAI's list of content parts."""
    if isinstance(content, list):
        texts = [str(p.get("text", "")) for p in content if isinstance(p, dict)]
    else:
        texts = [str(content)] if content else []
    return [{"type": "text", "text": t} for t in texts if t.strip()]


def _input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _tool(t: dict[str, Any]) -> dict[str, Any]:
    fn = t.get("function", t)
    return {
        "name": fn["name"],
        "description": fn.get("description", ""),
        "input_schema": fn.get("parameters") or fn.get("input_schema") or {"type": "object"},
    }


def _choice(choice: ToolChoice) -> dict[str, Any]:
    if choice == "auto":
        return {"type": "auto"}
    if choice == "required":
        return {"type": "any"}
    if choice == "none":
        return {"type": "none"}
    assert isinstance(choice, dict)
    return {"type": "tool", "name": named_tool(choice)}


def decode(body: dict[str, Any]) -> Reply:
    content = body.get("content")
    if not isinstance(content, list):
        raise ValueError("the response has no content blocks")
    text = "".join(b.get("text", "") for b in content if b.get("type") == "text")
    calls = [
        InProcessToolCall(
            id=str(b.get("id")), name=str(b.get("name")), arguments=b.get("input") or {}
        )
        for b in content
        if b.get("type") == "tool_use"
    ]
    usage = body.get("usage") or {}
    prompt = int(usage.get("input_tokens") or 0)
    completion = int(usage.get("output_tokens") or 0)
    return Reply(
        response=InProcessResponse(
            content=text,
            tool_calls=calls,
            usage=Usage(
                prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
            ),
        ),
        finish_reason=_finish(body.get("stop_reason"), bool(calls)),
        model=str(body.get("model") or ""),
    )


def _finish(reason: object, has_calls: bool) -> FinishReason:
    if has_calls or reason == "tool_use":
        return "tool_calls"
    if reason == "max_tokens":
        return "length"
    if reason == "refusal":
        return "content_filter"
    return "stop"

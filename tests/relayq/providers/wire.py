"""Replies in either dialect, and where each dialect keeps what the tests look at."""

from __future__ import annotations

from typing import Any

from relayq import BuiltinsConfig, ToolContext, Toolkit, create_toolkit, define_tool
from relayq.providers import Style
from relayq.relay import relay_tool
from tests.provider_server import (
    ProviderServer,
    Reply,
    anthropic_calls,
    anthropic_text,
    openai_calls,
    openai_text,
)

STYLES: list[Style] = ["openai", "anthropic"]

TEXT_USAGE = {"openai": (11, 7, 18), "anthropic": (13, 4, 17)}
"""(prompt, completion, total) tokens of a text reply, as each dialect's builder reports them."""
CALLS_USAGE = {"openai": (20, 5, 25), "anthropic": (30, 9, 39)}


def url_of(server: ProviderServer, style: Style) -> str:
    return server.openai_url if style == "openai" else server.anthropic_url


def call_id(style: Style, suffix: str) -> str:
    """A call id in the provider's own spelling: `call_abc` or `toolu_abc`."""
    return f"call_{suffix}" if style == "openai" else f"toolu_{suffix}"


def text_reply(style: Style, text: str) -> Reply:
    return openai_text(text) if style == "openai" else anthropic_text(text)


def calls_reply(style: Style, *calls: tuple[str, str, dict[str, Any]]) -> Reply:
    """`calls` are (id suffix, tool name, arguments)."""
    spelled = tuple((call_id(style, s), name, args) for s, name, args in calls)
    return openai_calls(*spelled) if style == "openai" else anthropic_calls(*spelled)


def tool_results(style: Style, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The results a request carries for the last assistant turn: `{id, content, is_error}`.

    openai: the tool messages after the last assistant message; anthropic: the
    tool_result blocks of the last user turn.
    """
    messages = body["messages"]
    if style == "openai":
        last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
        return [
            {"id": m["tool_call_id"], "content": m["content"], "is_error": False}
            for m in messages[last + 1 :]
            if m["role"] == "tool"
        ]
    return [
        {"id": b["tool_use_id"], "content": b["content"], "is_error": b.get("is_error", False)}
        for b in messages[-1]["content"]
        if b["type"] == "tool_result"
    ]


async def toolkit(counts: dict[str, int] | None = None) -> Toolkit:
    """`lookup` answers, `explode` raises, `deploy` is relayed to the host; runs are counted."""
    ran = counts if counts is not None else {}

    def lookup(args: dict[str, Any], ctx: ToolContext) -> str:
        ran["lookup"] = ran.get("lookup", 0) + 1
        return f"found {args.get('q', '')}"

    def explode(args: dict[str, Any], ctx: ToolContext) -> str:
        ran["explode"] = ran.get("explode", 0) + 1
        raise RuntimeError("boom")

    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    return await create_toolkit(
        builtins=BuiltinsConfig.off(),
        extra_tools=[
            define_tool("lookup", "Look something up.", schema, lookup),
            define_tool("explode", "Always fails.", None, explode),
            relay_tool(
                "deploy",
                "Deploy a service; the host does it.",
                {"type": "object", "properties": {"service": {"type": "string"}}},
            ),
        ],
    )

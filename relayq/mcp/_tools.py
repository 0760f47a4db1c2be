"""An MCP server's tools as relayq tools: each call goes to the server through the running
loop's session, retried when the server is away, an error result when it stays away."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import mcp_types

from relayq._errors import ToolkitError
from relayq._tools import Tool, ToolContext
from relayq._types import ToolResult
from relayq.mcp._errors import MCPError
from relayq.mcp._servers import MCPServer
from relayq.mcp._session import Listing, session_of
from relayq.retry import backoff

__all__ = ["SENDS", "listed_tools"]

log = logging.getLogger("relayq.mcp")

SENDS = 4
"""Sends of a call whose server cannot be reached, before the model gets an error result:
3.5 to 7 s of backoff in all, long enough for a server's restart."""

_LAST: dict[int, tuple[MCPServer, Listing]] = {}
"""Each server's last listing in this process (a forked pool child inherits its parent's):
what a turn offers while the server is away, so that its calls fail as tool calls do."""


async def listed_tools(server: MCPServer) -> tuple[Listing, list[Tool]]:
    """The server's tools, listed by the running loop's session (or last listed, while the
    server cannot be reached); MCPError if it never was."""
    try:
        listing = await (await session_of(server)).listing()
    except MCPError as exc:
        last = _LAST.get(id(server))
        if last is None or last[0] is not server:
            raise
        log.warning("%s; its tools as last listed are offered", exc)
        listing = last[1]
    else:
        _LAST[id(server)] = (server, listing)
    return listing, _as_tools(server, listing)


def _as_tools(server: MCPServer, listing: Listing) -> list[Tool]:
    names = {t.name for t in listing.tools}
    for option, named in (("relay", server.relay), ("resend", server.resend)):
        unknown = [n for n in named if n not in names]
        if unknown:
            raise ToolkitError(
                f"MCP server {server.label} lists no tool {', '.join(map(repr, unknown))} "
                f"that {option}= names (it lists {', '.join(sorted(names)) or 'none'})"
            )
    tools = [_as_tool(server, listed) for listed in listing.tools]
    return tools if server.wrap is None else [_wrapped(server, tool) for tool in tools]


def _wrapped(server: MCPServer, tool: Tool) -> Tool:
    assert server.wrap is not None
    try:
        wrapped = server.wrap(tool)
    except Exception as exc:
        raise ToolkitError(f"MCP server {server.label}: wrap({tool.name}) raised {exc!r}") from exc
    if not isinstance(wrapped, Tool):
        raise ToolkitError(
            f"MCP server {server.label}: wrap({tool.name}) returned "
            f"{type(wrapped).__name__}, not a Tool",
            tool.name,
        )
    return wrapped


def _as_tool(server: MCPServer, listed: mcp_types.Tool) -> Tool:
    schema: dict[str, Any] = dict(listed.input_schema or {"type": "object", "properties": {}})
    schema.pop("title", None)
    offered = server.offered_name(listed.name)
    description = listed.description or ""
    try:
        if listed.name in server.relay:
            return Tool(name=offered, description=description, schema=schema)
        remote = listed.name

        async def call(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
            return await _call(server, remote, args, ctx)

        return Tool(name=offered, description=description, schema=schema, fn=call)
    except ToolkitError as exc:
        raise ToolkitError(f"MCP server {server.label}: {exc}", offered) from None


async def _call(server: MCPServer, tool: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    """Send the call; again, after a backoff, while it never left (the server away), and
    after a send that may have reached the server only for a tool declared safe to resend
    (`resend=`): a call that timed out may have run, and its effect may not be made twice."""
    for send in range(1, SENDS + 1):
        # The server may make the call's effect happen once by the key (`ToolContext`); each
        # send carries an attempt of its own (a worker's retry of the call counts on).
        attempt = (ctx.attempt - 1) * SENDS + send
        meta = {"relayq/idempotency-key": ctx.idempotency_key, "relayq/attempt": attempt}
        try:
            result = await (await session_of(server)).call(tool, args, meta)
        except MCPError as exc:
            if exc.sent and tool not in server.resend:
                return ToolResult.error(
                    f"{exc} (sent once: it may have run; {tool!r} is not declared safe to resend)"
                )
            if send == SENDS:
                return ToolResult.error(f"{exc} (tried {SENDS} times)")
            await asyncio.sleep(backoff(send - 1, None, base=1.0, cap=4.0))
        else:
            return _as_result(result)
    raise AssertionError("unreachable")


def _as_result(result: mcp_types.CallToolResult) -> ToolResult:
    """Text blocks as text, joined by lines; any other block (an image, a resource) as its
    JSON; structured content alone as its JSON."""
    parts = [
        block.text
        if isinstance(block, mcp_types.TextContent)
        else json.dumps(block.model_dump(mode="json", by_alias=True, exclude_none=True))
        for block in result.content
    ]
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content))
    return ToolResult(output="\n".join(parts), is_error=bool(result.is_error))

"""Tools from MCP servers: `Agent(..., mcp_servers=[MCPServerHTTP(url), MCPServerStdio(cmd)])`.

A worker connects to each server once per process (per event loop), lists its tools and
offers them to the model, prefixed with the server's `name` where given. A call runs on
the worker like any local tool: the tool-call ledger, `attempt` and the idempotency key
(sent in the call's `_meta` as `relayq/idempotency-key`), approval wrappers and budgets
apply. A tool named in `relay=` is a relay tool instead: the host runs it.

A server that cannot be reached when a worker starts stops it with one line naming the
server; one that goes away mid-run is connected to again, and a call it cannot take is
sent up to `SENDS` times, then given to the model as an error result. A call that had no
reply in time is sent again only for a tool named in `resend=`: it may still be running.

The SDK (`mcp`) is imported only when an agent with MCP servers builds its tools.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from relayq.mcp._errors import MCPError
from relayq.mcp._servers import MCPServer, MCPServerHTTP, MCPServerStdio

if TYPE_CHECKING:
    from relayq._tools import Tool

__all__ = ["MCPError", "MCPServer", "MCPServerHTTP", "MCPServerStdio", "check_servers", "mcp_tools"]


async def mcp_tools(server: MCPServer) -> tuple[object, list[Tool]]:
    """`(listing, tools)`: the server's tools as this loop's session listed them (the
    listing object changes when a new session lists them anew)."""
    from relayq.mcp._tools import listed_tools

    return await listed_tools(server)


async def check_servers(servers: list[MCPServer]) -> None:
    """List each server's tools once; MCPError (or ToolkitError) names the first that fails."""
    for server in servers:
        await mcp_tools(server)

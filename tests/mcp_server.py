"""An MCP server for the tests, built with the `mcp` SDK, in a process of its own.

    python -m tests.mcp_server http PORT     # streamable HTTP on 127.0.0.1:PORT/mcp
    python -m tests.mcp_server stdio         # over stdin and stdout

Its tools write each execution to `$RELAYQ_TEST_LOG/mcp.log` (`tally`), so a test can
count them; `MCP_TEST_TOOLSET=2` lists one tool more (a server whose tools changed), and
`grow` adds one while it runs, telling its clients.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

server = MCPServer("relayq-test-tools", log_level="WARNING")


@server.tool()
def add(a: int, b: int) -> str:
    """Add two numbers."""
    return str(a + b)


def record(name: str, ctx: Context) -> None:
    """One line in `$RELAYQ_TEST_LOG/mcp.log`: `name`, and the key and attempt relayq sent."""
    meta = dict(ctx.request_context.meta or {})
    key = str(meta.get("relayq/idempotency-key", "-"))
    attempt = str(meta.get("relayq/attempt", "-"))
    folder = Path(os.environ.get("RELAYQ_TEST_LOG", "."))
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "mcp.log").open("a") as log:
        log.write(f"{name} {key} {attempt}\n")


@server.tool()
def tally(name: str, ctx: Context) -> str:
    """Record one execution of the call named `name`, with the key relayq sent."""
    record(name, ctx)
    return f"tallied {name} (pid {os.getpid()})"


@server.tool()
def whoami(ctx: Context) -> str:
    """The Authorization header the request came with."""
    return (ctx.headers or {}).get("authorization", "none")


@server.tool()
def ship(order: str) -> str:
    """Ship an order (the tests declare it a relay tool: the host runs it)."""
    return f"shipped {order} on the server"


@server.tool()
def nap(seconds: float, ctx: Context) -> str:
    """Record the call's receipt, sleep, then answer."""
    record("nap", ctx)
    time.sleep(seconds)
    return "rested"


def grown() -> str:
    """A tool `grow` adds while the server runs."""
    return f"grown (pid {os.getpid()})"


@server.tool()
async def grow(ctx: Context) -> str:
    """Add the tool `grown`, and tell every client its tools changed: a 2026-07-28 one on
    its `subscriptions/listen` stream, an earlier one by notification (this session's)."""
    if "grown" not in {t.name for t in await server.list_tools()}:
        server.add_tool(grown)
    await ctx.notify_tools_changed()
    if ctx.request_context.session.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS:
        await ctx.request_context.session.send_tool_list_changed()
    return "grew"


if os.environ.get("MCP_TEST_TOOLSET") == "2":

    @server.tool()
    def extra() -> str:
        """A tool the second tool set adds."""
        return "extra"


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", port=int(sys.argv[2]))

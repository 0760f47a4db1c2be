"""A small MCP server (the `mcp` SDK's `MCPServer`), for docs/mcp.md's examples.

python -m examples.mcp_calculator              # over stdin and stdout
python -m examples.mcp_calculator --port 8931  # streamable HTTP on 127.0.0.1:8931/mcp
"""

from __future__ import annotations

import argparse

from mcp.server.mcpserver import MCPServer

server = MCPServer("calculator", log_level="WARNING")


@server.tool()
def add(a: float, b: float) -> str:
    """Add two numbers."""
    return f"{a + b:g}"


@server.tool()
def multiply(a: float, b: float) -> str:
    """Multiply two numbers."""
    return f"{a * b:g}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, help="serve streamable HTTP on this port")
    port = parser.parse_args().port
    if port is None:
        server.run("stdio")
    else:
        server.run("streamable-http", port=port)

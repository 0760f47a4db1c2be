"""relayq's agents served to MCP clients (`relayq mcp`): see `api.mcp.front`."""

from api.mcp.front import WAIT, McpFront, mcp_app

__all__ = ["WAIT", "McpFront", "mcp_app"]

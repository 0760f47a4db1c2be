"""`serve`: `relayq mcp`, the agents as MCP tools, under uvicorn."""

from __future__ import annotations

import os

import uvicorn

from api._auth import Tokens
from api._security import secret_from
from api.mcp.front import McpFront, mcp_app
from relayq.agents import load_agents
from tasks.settings import Settings

__all__ = ["serve"]


def serve(host: str = "127.0.0.1", port: int = 8100) -> None:
    """Serve until interrupted; settings, tokens (`RELAYQ_API_TOKENS`) and the secret that
    seals `requestState` (`RELAYQ_API_SECRET`) come from the environment."""
    settings = Settings.from_env()
    load_agents(settings.agents)
    tokens = Tokens.parse(os.environ.get("RELAYQ_API_TOKENS", ""))
    front = McpFront(settings, tokens, secret=secret_from(os.environ.get("RELAYQ_API_SECRET")))
    config = uvicorn.Config(mcp_app(front, host=host), host=host, port=port, log_level="info")
    uvicorn.Server(config).run()

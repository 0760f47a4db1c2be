"""`serve`: `relayq mcp`, the agents as MCP tools, under uvicorn; `serve_stdio`: the same
over stdin and stdout (`relayq mcp --stdio`), for clients that start their servers."""

from __future__ import annotations

import logging
import os
import sys

import anyio
import uvicorn
from mcp.server.stdio import stdio_server

from api._auth import Permission, Principal, Tokens
from api._security import secret_from
from api.mcp.front import McpFront, mcp_app
from relayq.agents import load_agents
from tasks.settings import Settings

__all__ = ["TOKEN_ENV", "serve", "serve_stdio", "stdio_principal"]

TOKEN_ENV = "RELAYQ_API_TOKEN"
"""The token `relayq mcp --stdio` acts with: one of RELAYQ_API_TOKENS, a submitter's."""


def _front(principal: Principal | None = None) -> McpFront:
    settings = Settings.from_env()
    load_agents(settings.agents)
    tokens = Tokens.parse(os.environ.get("RELAYQ_API_TOKENS", ""))
    secret = secret_from(os.environ.get("RELAYQ_API_SECRET"))
    return McpFront(settings, tokens, secret=secret, principal=principal)


def serve(host: str = "127.0.0.1", port: int = 8100) -> None:
    """Serve until interrupted; settings, tokens (`RELAYQ_API_TOKENS`) and the secret that
    seals `requestState` (`RELAYQ_API_SECRET`) come from the environment."""
    front = _front()
    config = uvicorn.Config(mcp_app(front, host=host), host=host, port=port, log_level="info")
    uvicorn.Server(config).run()


def stdio_principal() -> Principal:
    """Who `relayq mcp --stdio` acts as: the holder of TOKEN_ENV among RELAYQ_API_TOKENS.
    ValueError, saying what is wrong and never the token, if it is not a submitter's."""
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        raise ValueError(f"relayq mcp --stdio acts with a submitter's token: set {TOKEN_ENV}")
    who = Tokens.parse(os.environ.get("RELAYQ_API_TOKENS", "")).lookup(token)
    if who is None:
        raise ValueError(f"{TOKEN_ENV} is none of RELAYQ_API_TOKENS")
    if not who.may(Permission.SUBMIT):
        raise ValueError(
            f"{TOKEN_ENV} is {who.name}'s, a {who.role}: starting runs takes a submitter's"
        )
    return who


def serve_stdio() -> None:
    """Serve one client over stdin and stdout until stdin closes. Its messages alone go to
    stdout: logs go to stderr."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    front = _front(stdio_principal())

    async def run() -> None:
        async with stdio_server() as (read, write):
            options = front.server.create_initialization_options()
            await front.server.run(read, write, options)

    anyio.run(run)

"""`serve`: the API and the inbox under uvicorn (`relayq api`)."""

from __future__ import annotations

import uvicorn

from api.app import create_app

__all__ = ["serve"]


def serve(host: str = "127.0.0.1", port: int = 8000) -> None:
    """Run the API until interrupted; settings and tokens come from the environment."""
    # Open event streams never end by themselves: give them a moment, then close them.
    uvicorn.run(create_app(), host=host, port=port, timeout_graceful_shutdown=3)

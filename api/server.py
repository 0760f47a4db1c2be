"""`serve`: the API and the inbox under uvicorn (`relayq api`)."""

from __future__ import annotations

from types import FrameType

import uvicorn

from api._state import Closing
from api.app import create_app

__all__ = ["serve"]


class _Server(uvicorn.Server):
    """uvicorn's server, telling the app as soon as a signal asks it to stop: its hosts'
    long polls then answer at once (`api._state.closing`), where uvicorn would cancel them
    when the grace below ends, and each caller would get a 500."""

    def __init__(self, config: uvicorn.Config, closing: Closing) -> None:
        super().__init__(config)
        self._closing = closing

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._closing.set()
        super().handle_exit(sig, frame)


def serve(host: str = "127.0.0.1", port: int = 8000) -> None:
    """Run the API until interrupted; settings and tokens come from the environment."""
    app = create_app()
    # Open event streams never end by themselves: give them a moment, then close them.
    config = uvicorn.Config(app, host=host, port=port, timeout_graceful_shutdown=3)
    _Server(config, app.state.closing).run()

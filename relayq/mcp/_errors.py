"""The error of a server that cannot be reached, listed or called."""

from __future__ import annotations

from relayq._errors import RelayqError

__all__ = ["MCPError"]


class MCPError(RelayqError):
    """An MCP server could not be reached, listed or called; `.server` names it. `.sent`:
    the call reached the server and had no reply in time: it may be running there still."""

    def __init__(self, reason: str, server: str, sent: bool = False) -> None:
        super().__init__(reason, server, sent)
        self.reason = reason
        self.server = server
        self.sent = sent

    def __str__(self) -> str:
        return f"MCP server {self.server}: {self.reason}"

"""An MCP client of the handshake-era revisions (2024-11-05 to 2025-11-25), written from
the specification over plain HTTP: it declares whichever revision and capabilities a test
names, which the `mcp` SDK's own client does not let it choose, and shows each message as
it came.

Streamable HTTP as those revisions have it: `initialize`, then the session's id
(`Mcp-Session-Id`) and, from 2025-06-18, `MCP-Protocol-Version` on every request; a reply
is JSON, or an event stream that may carry the server's own requests (an elicitation)
before the reply, each answered with a POST of its own.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = ["Elicited", "RpcError", "connected_at"]

Answerer = Callable[[dict[str, Any]], dict[str, Any] | None]
"""An elicitation's params to the client's result (`{action, content}`); None: the client
never answers it."""


class RpcError(Exception):
    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(f"{error.get('code')}: {error.get('message')}")
        self.code = error.get("code")
        self.message = str(error.get("message"))


@dataclass
class Elicited:
    """What the server asked, in order, and what it was told."""

    asked: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class HandshakeClient:
    http: httpx.AsyncClient
    url: str
    version: str
    answer: Answerer | None
    elicited: Elicited
    session_id: str | None = None
    negotiated: str | None = None
    _ids: int = 0

    def headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json, text/event-stream"}
        if self.session_id is not None:
            headers["Mcp-Session-Id"] = self.session_id
        if self.negotiated is not None and self.negotiated >= "2025-06-18":
            headers["MCP-Protocol-Version"] = self.negotiated
        return headers

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """The result of `method`; RpcError for an error reply."""
        self._ids += 1
        message = {"jsonrpc": "2.0", "id": self._ids, "method": method, "params": params}
        async with self.http.stream(
            "POST", self.url, json=message, headers=self.headers()
        ) as reply:
            if reply.status_code >= 400:
                await reply.aread()
                raise RpcError({"code": reply.status_code, "message": reply.text})
            if self.session_id is None:
                self.session_id = reply.headers.get("mcp-session-id")
            if reply.headers.get("content-type", "").startswith("application/json"):
                return _outcome(json.loads(await reply.aread()))
            async for event in _events(reply):
                if event.get("id") == self._ids and "method" not in event:
                    return _outcome(event)
                if "method" in event and "id" in event:
                    await self._answer_server(event)
        raise RpcError({"code": None, "message": "the stream ended without a reply"})

    async def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        reply = await self.http.post(self.url, json=message, headers=self.headers())
        assert reply.status_code == 202, reply.text

    async def _answer_server(self, request: dict[str, Any]) -> None:
        if request["method"] == "elicitation/create" and self.answer is not None:
            self.elicited.asked.append(request["params"])
            result = self.answer(request["params"])
            if result is None:
                return
            body: dict[str, Any] = {"result": result}
        else:
            body = {"error": {"code": -32601, "message": f"no {request['method']} here"}}
        response = {"jsonrpc": "2.0", "id": request["id"], **body}
        reply = await self.http.post(self.url, json=response, headers=self.headers())
        assert reply.status_code == 202, reply.text

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return await self.request("tools/call", {"name": name, "arguments": arguments})


def _outcome(reply: dict[str, Any]) -> dict[str, Any]:
    if "error" in reply:
        raise RpcError(reply["error"])
    result: dict[str, Any] = reply["result"]
    return result


async def _events(reply: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON-RPC messages of an event stream: an event's `data` lines, joined."""
    data: list[str] = []
    async for line in reply.aiter_lines():
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif not line and data:
            yield json.loads("\n".join(data))
            data = []


@contextlib.asynccontextmanager
async def connected_at(
    url: str,
    token: str,
    version: str,
    *,
    capabilities: dict[str, Any] | None = None,
    answer: Answerer | None = None,
) -> AsyncIterator[tuple[HandshakeClient, Elicited]]:
    """A session of `version`, initialized, declaring `capabilities`; `answer` answers the
    server's elicitations."""
    headers = {"Authorization": f"Bearer {token}"}
    timeout = httpx.Timeout(30, read=90)
    async with httpx.AsyncClient(headers=headers, timeout=timeout, trust_env=False) as http:
        client = HandshakeClient(http, url, version, answer, Elicited())
        init = await client.request(
            "initialize",
            {
                "protocolVersion": version,
                "capabilities": capabilities or {},
                "clientInfo": {"name": "handshake-client", "version": "1"},
            },
        )
        client.negotiated = init["protocolVersion"]
        await client.notify("notifications/initialized")
        try:
            yield client, client.elicited
        finally:
            if client.session_id is not None:
                await http.delete(url, headers=client.headers())

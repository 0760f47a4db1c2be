"""A bare HTTP/1.1 server on a socket, for what the provider server cannot show: how many
connections a client opened, the request line as sent (to a proxy), an answer that never
comes or a connection dropped before it.

    with PlainServer() as plain:
        plain.mode = "drop"
        ... plain.connections, plain.open, plain.request_lines, plain.headers
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import threading
from typing import Literal

from tests.provider_server import openai_text

Mode = Literal["answer", "hang", "drop"]

_ANSWER = json.dumps(openai_text("plain").body).encode()


class PlainServer:
    """Serves every request with an OpenAI text reply (`answer`), never answers (`hang`), or
    closes the connection having read the request (`drop`). Keeps connections alive."""

    def __init__(self, *, tls: ssl.SSLContext | None = None) -> None:
        self.mode: Mode = "answer"
        self.connections = 0
        """Connections accepted so far."""
        self.open = 0
        """Connections open now."""
        self.request_lines: list[str] = []
        self.headers: list[dict[str, str]] = []
        """Each request's headers, names in lower case."""
        self._tls = tls
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._handlers: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

    @property
    def base(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"{'https' if self._tls else 'http'}://127.0.0.1:{port}"

    def __enter__(self) -> PlainServer:
        self._thread.start()
        start = asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self._tls)
        self._server = asyncio.run_coroutine_threadsafe(start, self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._handlers.values():
            writer.close()  # its handler reads the end of the stream, and returns
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers[task] = writer
        self.connections += 1
        self.open += 1
        # Served until the client closes, goes away, or refuses our certificate.
        gone = (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError)
        try:
            with contextlib.suppress(*gone):
                served = True
                while served:
                    served = await self._one(reader, writer)
        finally:
            self.open -= 1
            self._handlers.pop(task, None)
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; False once the connection is to close."""
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        self.request_lines.append(head[0])
        fields = dict(line.split(":", 1) for line in head[1:] if ":" in line)
        headers = {name.lower(): value.strip() for name, value in fields.items()}
        self.headers.append(headers)
        await reader.readexactly(int(headers.get("content-length", 0)))
        if self.mode == "drop":
            return False
        if self.mode == "hang":
            await reader.read()  # until the client gives up or the server stops
            return False
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(_ANSWER)}\r\n\r\n".encode()
            + _ANSWER
        )
        await writer.drain()
        return True

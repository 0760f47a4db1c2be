"""A webhook receiver speaking real HTTP on 127.0.0.1, for the tests: it keeps what it gets.

with Receiver() as receiver:          # a free port
    ... receiver.url("/hooks") ...
receiver = Receiver(port=p, fail_first=True).start()   # 500 to an event's first delivery
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int
    """What the receiver answered: 200, or 500 to a first delivery with `fail_first`."""

    @property
    def event_id(self) -> str:
        return self.headers["X-Relayq-Event-Id"]

    def json(self) -> Any:
        return json.loads(self.body)


class Receiver:
    def __init__(self, port: int = 0, *, fail_first: bool = False) -> None:
        self.port = port
        self.fail_first = fail_first
        self.received: list[Received] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def start(self) -> Receiver:
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def got(self) -> list[Received]:
        with self._lock:
            return list(self.received)

    def _keep(self, path: str, headers: dict[str, str], body: bytes) -> int:
        with self._lock:
            seen = any(r.event_id == headers.get("X-Relayq-Event-Id") for r in self.received)
            status = 500 if self.fail_first and not seen else 200
            self.received.append(Received(path, headers, body, status))
            return status

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status = receiver._keep(self.path, dict(self.headers.items()), body)
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: Any) -> None:
                """Say nothing: http.server writes every request to stderr, and the
                test's assertions already say what matters."""

        return Handler

"""The webfetch builtin, against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from relayq._tools import ToolContext
from relayq._types import ToolResult
from relayq.builtins import BuiltinsConfig, builtin_tools

_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


@pytest.fixture(autouse=True)
def _no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    # A proxy from the environment would send requests for 127.0.0.1 elsewhere.
    for name in _PROXY_VARS:
        monkeypatch.delenv(name, raising=False)


def _make_handler(release: threading.Event) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            routes = {
                "/text": (200, "text/plain; charset=utf-8", "hello, wörld".encode()),
                "/missing": (404, "text/plain", b"no such page"),
                "/json": (200, "application/json", b'{"ok": true}'),
                "/image": (200, "image/png", b"\x89PNG\r\n\x1a\n"),
                "/long": (200, "text/plain", b"x" * 1000),
            }
            if self.path == "/redirect":
                self._send(302, "text/plain", b"", location="/text")
            elif self.path == "/slow":
                # Held until the test ends; the client must give up first.
                release.wait(10)
            else:
                self._send(*routes.get(self.path, (500, "text/plain", b"unknown route")))

        def _send(self, status: int, kind: str, body: bytes, location: str = "") -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            if location:
                self.send_header("Location", location)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep test output clean

    return Handler


@pytest.fixture
def server() -> Iterator[str]:
    release = threading.Event()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(release))
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


async def _fetch(args: dict[str, Any], config: BuiltinsConfig | None = None) -> ToolResult:
    (tool,) = builtin_tools(config or BuiltinsConfig.only("webfetch"))
    ctx = ToolContext(run_id="run_t", call_id="c1", tool_name="webfetch", base_dir=Path("."))
    out = await tool.invoke(args, ctx)
    assert isinstance(out, ToolResult)
    return out


async def test_a_200_response_returns_the_text_body(server: str) -> None:
    out = await _fetch({"url": f"{server}/text"})

    assert out == ToolResult(output="hello, wörld")


async def test_json_counts_as_text(server: str) -> None:
    out = await _fetch({"url": f"{server}/json"})

    assert out == ToolResult(output='{"ok": true}')


async def test_a_404_is_an_error_carrying_the_status(server: str) -> None:
    out = await _fetch({"url": f"{server}/missing"})

    assert out.is_error
    assert "HTTP 404" in out.output
    assert "no such page" in out.output


async def test_redirects_are_followed(server: str) -> None:
    out = await _fetch({"url": f"{server}/redirect"})

    assert out == ToolResult(output="hello, wörld")


async def test_a_slow_server_times_out_with_an_error(server: str) -> None:
    out = await _fetch({"url": f"{server}/slow", "timeout_seconds": 0.5})

    assert out.is_error
    assert "timed out after 0.5 s" in out.output


async def test_a_binary_body_is_an_error(server: str) -> None:
    out = await _fetch({"url": f"{server}/image"})

    assert out.is_error
    assert "image/png" in out.output


async def test_a_long_body_is_cut_with_a_note(server: str) -> None:
    config = BuiltinsConfig(enabled=frozenset({"webfetch"}), max_output_chars=100)

    out = await _fetch({"url": f"{server}/long"}, config)

    assert out.output.startswith("x" * 100 + "\n")
    assert "900 of 1000 characters not shown" in out.output


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "ftp://127.0.0.1/x", "javascript:alert(1)", "127.0.0.1/text"]
)
async def test_urls_other_than_http_and_https_are_refused(url: str) -> None:
    out = await _fetch({"url": url})

    assert out.is_error
    assert "only http:// and https:// URLs" in out.output


async def test_a_refused_connection_is_an_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # Nothing listens on the port any more.

    out = await _fetch({"url": f"http://127.0.0.1:{port}/"})

    assert out.is_error
    assert "could not fetch" in out.output

"""The webfetch builtin, against real HTTP servers on loopback addresses.

Loopback is refused by default, so most tests allow it through the opt-in; no
test sends anything to an address outside 127.0.0.0/8.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from relayq import ToolContext, ToolkitError, ToolResult
from relayq.builtins import BuiltinsConfig, builtin_tools
from relayq.builtins._netguard import non_global_kind
from tests.ports import free_port

_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


@pytest.fixture(autouse=True)
def _no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    # A proxy from the environment would send requests for 127.0.0.1 elsewhere.
    for name in _PROXY_VARS:
        monkeypatch.delenv(name, raising=False)


@dataclass
class Seen:
    """What a test server was asked for."""

    paths: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)


def _make_handler(release: threading.Event, seen: Seen) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.paths.append(self.path)
            seen.hosts.append(self.headers.get("Host", ""))
            routes = {
                "/text": (200, "text/plain; charset=utf-8", "hello, wörld".encode()),
                "/missing": (404, "text/plain", b"no such page"),
                "/json": (200, "application/json", b'{"ok": true}'),
                "/image": (200, "image/png", b"\x89PNG\r\n\x1a\n"),
                "/long": (200, "text/plain", b"x" * 1000),
            }
            if self.path == "/redirect":
                self._send(302, "text/plain", b"", location="/text")
            elif self.path.startswith("/redirect-to/"):
                target = "http://" + self.path.removeprefix("/redirect-to/")
                self._send(302, "text/plain", b"", location=target)
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


@contextlib.contextmanager
def _serving(host: str, port: int = 0) -> Iterator[tuple[str, Seen]]:
    release = threading.Event()
    seen = Seen()
    httpd = ThreadingHTTPServer((host, port), _make_handler(release, seen))
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield f"{host}:{httpd.server_address[1]}", seen
    finally:
        release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


@pytest.fixture
def served() -> Iterator[tuple[str, Seen]]:
    with _serving("127.0.0.1") as (where, seen):
        yield f"http://{where}", seen


@pytest.fixture
def server(served: tuple[str, Seen]) -> str:
    return served[0]


LOOPBACK_ALLOWED = BuiltinsConfig(
    enabled=frozenset({"webfetch"}), webfetch_allowed_networks=("127.0.0.0/8",)
)


async def _fetch(args: dict[str, Any], config: BuiltinsConfig | None = None) -> ToolResult:
    (tool,) = builtin_tools(config or LOOPBACK_ALLOWED)
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
    config = BuiltinsConfig(
        enabled=frozenset({"webfetch"}),
        max_output_chars=100,
        webfetch_allowed_networks=("127.0.0.1/32",),
    )

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
    port = free_port()  # nothing listens there

    out = await _fetch({"url": f"http://127.0.0.1:{port}/"})

    assert out.is_error
    assert "could not fetch" in out.output


# -- only public addresses, unless the agent allows more ----------------------

DEFAULT = BuiltinsConfig.only("webfetch")


async def test_a_loopback_server_is_refused_by_default(served: tuple[str, Seen]) -> None:
    server, seen = served

    out = await _fetch({"url": f"{server}/text"}, DEFAULT)

    assert out.is_error
    assert "refused to fetch" in out.output
    assert "loopback address" in out.output
    assert "webfetch_allowed_networks" in out.output
    assert seen.paths == []


async def test_a_host_name_resolving_to_loopback_is_refused(served: tuple[str, Seen]) -> None:
    server, seen = served
    port = server.rsplit(":", 1)[1]

    out = await _fetch({"url": f"http://localhost:{port}/text"}, DEFAULT)

    assert out.is_error
    assert "localhost resolves to" in out.output
    assert "loopback address" in out.output
    assert seen.paths == []


async def test_the_opt_in_allows_exactly_the_networks_it_names(served: tuple[str, Seen]) -> None:
    server, _ = served
    this = BuiltinsConfig(
        enabled=frozenset({"webfetch"}), webfetch_allowed_networks=("127.0.0.1/32",)
    )
    other = BuiltinsConfig(
        enabled=frozenset({"webfetch"}), webfetch_allowed_networks=("127.0.0.2/32",)
    )

    allowed = await _fetch({"url": f"{server}/text"}, this)
    refused = await _fetch({"url": f"{server}/text"}, other)

    assert allowed == ToolResult(output="hello, wörld")
    assert refused.is_error
    assert "loopback address" in refused.output


async def test_a_redirect_to_a_refused_address_is_not_followed(
    served: tuple[str, Seen],
) -> None:
    # Given an allowed server (127.0.0.2) that redirects to a refused one (127.0.0.1)
    inner, inner_seen = served
    only_outer = BuiltinsConfig(
        enabled=frozenset({"webfetch"}), webfetch_allowed_networks=("127.0.0.2/32",)
    )
    with _serving("127.0.0.2") as (outer, outer_seen):
        target = inner.removeprefix("http://")

        # When the model fetches the allowed one
        out = await _fetch({"url": f"http://{outer}/redirect-to/{target}/text"}, only_outer)

    # Then the redirect is judged like the first hop, and refused
    assert out.is_error
    assert "refused to fetch" in out.output
    assert "127.0.0.1" in out.output
    assert outer_seen.paths == [f"/redirect-to/{target}/text"]
    assert inner_seen.paths == []


async def test_the_address_judged_is_the_address_connected_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A DNS answer that changes between check and connect (rebinding) must not
    # matter: the name is resolved once, and the connection goes to that address.
    with _serving("127.0.0.2") as (allowed, allowed_seen):
        port = int(allowed.rsplit(":", 1)[1])
        with _serving("127.0.0.1", port) as (_, private_seen):
            real = socket.getaddrinfo
            answers = iter(["127.0.0.2"])

            def rebinding(host: Any, *args: Any, **kwargs: Any) -> Any:
                if host == "rebind.test":
                    host = next(answers, "127.0.0.1")
                return real(host, *args, **kwargs)

            monkeypatch.setattr(socket, "getaddrinfo", rebinding)
            config = BuiltinsConfig(
                enabled=frozenset({"webfetch"}), webfetch_allowed_networks=("127.0.0.2/32",)
            )

            out = await _fetch({"url": f"http://rebind.test:{port}/text"}, config)

    assert out == ToolResult(output="hello, wörld")
    assert allowed_seen.hosts == [f"rebind.test:{port}"]
    assert private_seen.paths == []


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("fc00::1", "private"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("ff0e::1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("100.64.0.1", "non-global"),
        ("192.0.2.1", "private"),
        ("::ffff:127.0.0.1", "loopback (as ::ffff:7f00:1)"),
        ("::ffff:10.0.0.1", "private (as ::ffff:a00:1)"),
        ("2002:7f00:1::", "loopback (as 2002:7f00:1::)"),
        ("64:ff9b::7f00:1", "reserved"),
        ("8.8.8.8", None),
        ("2001:4860:4860::8888", None),
    ],
)
def test_every_non_global_address_kind_is_named(address: str, kind: str | None) -> None:
    # Judged without any traffic: the public examples are only parsed, never contacted.
    assert non_global_kind(ipaddress.ip_address(address)) == kind


def test_an_invalid_allowed_network_is_a_toolkit_error() -> None:
    with pytest.raises(ToolkitError, match="webfetch_allowed_networks"):
        BuiltinsConfig(webfetch_allowed_networks=("not a network",))

"""`Sessions`: a provider's HTTP connections, one aiohttp session per event loop.

aiohttp, not httpx: with 500 calls in flight a call costs about a quarter of
the CPU it took through httpx clients in shards (`python -m bench.transport`).

A session belongs to the loop it was made on (`relayq.perloop`): `Sessions.aclose()`
closes the running loop's, and one left open is closed as its loop ends, or at exit.

As httpx did: certificates from certifi, the proxy the environment names
(HTTP_PROXY, HTTPS_PROXY, ALL_PROXY, less NO_PROXY), read when a loop's
session is made; no redirects followed; idle connections kept 5 s.
"""

from __future__ import annotations

import codecs
import functools
import ssl
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
import certifi

from relayq.perloop import PerLoop

__all__ = ["UNREACHABLE", "Answer", "Sessions", "proxy_for"]

UNREACHABLE: tuple[type[Exception], ...] = (aiohttp.ClientError, OSError)
"""What `Sessions.post` raises when the endpoint cannot be reached or breaks off; a timeout
is a TimeoutError (an OSError, and for aiohttp a ClientError too)."""

_KEEP_IDLE = 2.0
"""Seconds an idle connection is kept open (aiohttp closes it within twice that). Well
under the 5 s after which uvicorn and Node close one: a busy loop reads a server's close
late, and a call sent on a connection just closed fails "Server disconnected"."""


@dataclass(frozen=True, slots=True)
class Answer:
    """A response, read whole."""

    status: int
    headers: Mapping[str, str]
    """Case-insensitive."""
    body: bytes
    charset: str | None
    """From the Content-Type header, if it names one."""

    def text(self) -> str:
        """The body as text, in its charset (else UTF-8), undecodable bytes replaced."""
        charset = self.charset or "utf-8"
        try:
            codecs.lookup(charset)
        except LookupError:
            charset = "utf-8"
        return self.body.decode(charset, errors="replace")


@functools.cache
def _tls() -> ssl.SSLContext:
    # Loading the bundle takes tens of milliseconds: once per process, shared by every loop.
    return ssl.create_default_context(cafile=certifi.where())


def proxy_for(url: str) -> str | None:
    """The proxy the environment names for `url`: HTTP_PROXY or HTTPS_PROXY by its scheme,
    else ALL_PROXY; none when NO_PROXY covers its host."""
    proxies = urllib.request.getproxies()
    parts = urlsplit(url)
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy or _bypassed(parts.hostname or "", proxies.get("no", "")):
        return None
    return proxy if "://" in proxy else f"http://{proxy}"


def _bypassed(host: str, no_proxy: str) -> bool:
    """NO_PROXY as curl reads it: `*` covers every host, a name covers itself and its
    subdomains (a leading dot changes nothing)."""
    for entry in no_proxy.split(","):
        name = entry.strip().lstrip(".").lower()
        if name == "*" or (name and (host == name or host.endswith("." + name))):
            return True
    return False


@dataclass(frozen=True, slots=True)
class _Opened:
    """One loop's session, and the proxy read when it was made."""

    session: aiohttp.ClientSession
    proxy: str | None


class Sessions:
    """Connections to one endpoint: an aiohttp session per event loop, made at its first call.

    `timeout` bounds each step (getting a connection, connecting, each wait for
    data), not the whole call, as httpx's did; aiohttp raises a TimeoutError.
    """

    def __init__(self, url: str, *, max_connections: int, timeout: float) -> None:
        self._url = url
        self._max_connections = max_connections
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=timeout, sock_connect=timeout, sock_read=timeout
        )
        self._open = PerLoop(open=self._start, close=lambda opened: opened.session.close())

    async def post(self, body: bytes, headers: Mapping[str, str]) -> Answer:
        """POST `body` (JSON) to the endpoint and read the whole answer, whatever its status.

        Raises TimeoutError, or one of UNREACHABLE when the endpoint cannot be reached.
        """
        opened = await self._open.get()
        async with opened.session.post(
            self._url,
            data=body,
            headers={**headers, "Content-Type": "application/json"},
            proxy=opened.proxy,
            allow_redirects=False,
        ) as response:
            return Answer(
                status=response.status,
                headers=response.headers,
                body=await response.read(),
                charset=response.charset,
            )

    def _start(self) -> _Opened:
        connector = aiohttp.TCPConnector(
            limit=self._max_connections, ssl=_tls(), keepalive_timeout=_KEEP_IDLE
        )
        # trust_env off: the proxy is read here, once, and ~/.netrc is not consulted
        # (it could add credentials meant for another client).
        session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return _Opened(session, proxy_for(self._url))

    async def aclose(self) -> None:
        """Close the running loop's session; the next call opens a new one."""
        await self._open.aclose()

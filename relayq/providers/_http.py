"""`Sessions`: a provider's HTTP connections, one aiohttp session per event loop.

aiohttp, not httpx: with 500 calls in flight a call costs about a quarter of
the CPU it took through httpx clients in shards (`python -m bench.transport`).

A session belongs to the loop it was made on. `Sessions.aclose()` closes the
running loop's. A loop that ends without it closes its session as it shuts
down its async generators (asyncio.run and asyncio.Runner do, pytest-asyncio's
loops too: it is the one hook a loop offers), and a loop still running when the process
exits (a worker's loop thread) has its session closed at exit.

As httpx did: certificates from certifi, the proxy the environment names
(HTTP_PROXY, HTTPS_PROXY, ALL_PROXY, less NO_PROXY), read when a loop's
session is made; no redirects followed; idle connections kept 5 s.
"""

from __future__ import annotations

import asyncio
import atexit
import codecs
import concurrent.futures
import contextlib
import functools
import ssl
import urllib.request
import weakref
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
import certifi

__all__ = ["UNREACHABLE", "Answer", "Sessions", "proxy_for"]

UNREACHABLE: tuple[type[Exception], ...] = (aiohttp.ClientError, OSError)
"""What `Sessions.post` raises when the endpoint cannot be reached or breaks off; a timeout
is a TimeoutError (an OSError, and for aiohttp a ClientError too)."""

_KEEP_IDLE = 2.0
"""Seconds an idle connection is kept open (aiohttp closes it within twice that). Well
under the 5 s after which uvicorn and Node close one: a busy loop reads a server's close
late, and a call sent on a connection just closed fails "Server disconnected"."""
_EXIT_WAIT = 1.0
"""Seconds to wait at exit, in all, for running loops to close their sessions."""


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


@dataclass(slots=True)
class _Opened:
    """One loop's session, the proxy read when it was made, and what closes it with its loop."""

    session: aiohttp.ClientSession
    proxy: str | None
    closer: AsyncGenerator[None, None] | None = None


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
        self._open: dict[asyncio.AbstractEventLoop, _Opened] = {}
        _LIVE.add(self)

    async def post(self, body: bytes, headers: Mapping[str, str]) -> Answer:
        """POST `body` (JSON) to the endpoint and read the whole answer, whatever its status.

        Raises TimeoutError, or one of UNREACHABLE when the endpoint cannot be reached.
        """
        loop = asyncio.get_running_loop()
        opened = self._open.get(loop) or await self._start(loop)
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

    async def _start(self, loop: asyncio.AbstractEventLoop) -> _Opened:
        connector = aiohttp.TCPConnector(
            limit=self._max_connections, ssl=_tls(), keepalive_timeout=_KEEP_IDLE
        )
        # trust_env off: the proxy is read here, once, and ~/.netrc is not consulted
        # (it could add credentials meant for another client).
        session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        opened = self._open[loop] = _Opened(session, proxy_for(self._url))
        opened.closer = self._close_with_loop(loop, opened)
        await anext(opened.closer)  # the loop now holds it, to finish as the loop ends
        return opened

    async def _close_with_loop(
        self, loop: asyncio.AbstractEventLoop, opened: _Opened
    ) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            if self._open.get(loop) is opened:
                del self._open[loop]
            await opened.session.close()

    async def aclose(self) -> None:
        """Close the running loop's session; the next call opens a new one."""
        await self._close(asyncio.get_running_loop())

    async def _close(self, loop: asyncio.AbstractEventLoop) -> None:
        opened = self._open.get(loop)
        if opened is not None and opened.closer is not None:
            await opened.closer.aclose()

    def close_from_outside(self) -> list[concurrent.futures.Future[None]]:
        """Close each loop's session from outside its loop, at exit: a loop that is idle at
        once; one still running in its thread (a worker's) as soon as it can, returning the
        futures to wait for. A closed loop runs nothing: its sockets go with the process."""
        running = []
        for loop in list(self._open):
            if loop.is_running():
                running.append(asyncio.run_coroutine_threadsafe(self._close(loop), loop))
            elif not loop.is_closed():
                loop.run_until_complete(self._close(loop))
        return running


_LIVE: weakref.WeakSet[Sessions] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    closing = []
    for sessions in list(_LIVE):
        # Exiting anyway: whatever fails to close leaves its sockets to the OS.
        with contextlib.suppress(Exception):
            closing += sessions.close_from_outside()
    concurrent.futures.wait(closing, timeout=_EXIT_WAIT)

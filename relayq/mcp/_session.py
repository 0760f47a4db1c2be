"""One session with one MCP server per event loop: opened at first use, opened again after
it fails, closed with its loop.

The SDK's client lives inside anyio task groups, which must be entered and left by one
task: each session is held open by a task of its own (`_hold`) until it is closed or
its connection breaks. Callers on other tasks share it.

The holder also follows the server's tool list: told it changed (a handshake-era
server's `notifications/tools/list_changed`, or a 2026-07-28 server's event on a
`subscriptions/listen` stream), it lists the tools again, and the next turns offer the
new list.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any

import httpx2
import mcp_types
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError as MCPSDKError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from relayq.mcp._errors import MCPError
from relayq.mcp._servers import MCPServer, MCPServerHTTP
from relayq.perloop import PerLoop

__all__ = ["Listing", "Session", "session_of"]

log = logging.getLogger("relayq.mcp")


@dataclass(frozen=True, slots=True)
class Listing:
    """A server's tools as one session last listed them."""

    tools: tuple[mcp_types.Tool, ...]


@dataclass(slots=True)
class _Connection:
    client: Client
    listing: Listing
    """Listed at the start, and again each time the server says its tools changed."""


class Session:
    """The running loop's connection to `server` (see the module)."""

    def __init__(self, server: MCPServer) -> None:
        self.server = server
        self._open: asyncio.Future[_Connection] | None = None
        self._holder: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._lock = asyncio.Lock()

    async def listing(self) -> Listing:
        """The tools of the server, connecting first if need be; MCPError if it cannot."""
        return (await self._wait(await self._opened())).listing

    async def call(
        self, tool: str, arguments: dict[str, Any], meta: dict[str, Any]
    ) -> mcp_types.CallToolResult:
        """Call `tool`; MCPError if the server cannot be reached or does not answer in time
        (the connection is dropped, and the next use opens another)."""
        opened = await self._opened()
        client = (await self._wait(opened)).client
        timeout = self.server.call_timeout.total_seconds()
        try:
            async with asyncio.timeout(timeout):
                return await client.call_tool(tool, arguments, meta=meta)  # type: ignore[arg-type]
        except Exception as exc:
            await self._drop(opened)
            if isinstance(exc, TimeoutError):
                # It may still be running there: sent again, it would run twice at once.
                raise MCPError(f"no reply in {timeout:g} s", self.server.label, True) from None
            # A connection that ended took the call with it (the server's process, or its
            # session, is gone): sent again, the key lets the server tell the two apart.
            raise MCPError(_brief(exc), self.server.label) from exc

    async def aclose(self) -> None:
        """Close the connection; the next use opens a new one. Safe to call twice."""
        await self._drop(None)

    async def _opened(self) -> asyncio.Future[_Connection]:
        """The current connection's future, a new one if the last failed or ended."""
        async with self._lock:
            if self._open is None or not _usable(self._open, self._holder):
                await self._close_locked()
                self._open = asyncio.get_running_loop().create_future()
                self._holder = asyncio.create_task(self._hold(self._open, self._stop))
            return self._open

    async def _wait(self, opened: asyncio.Future[_Connection]) -> _Connection:
        seconds = self.server.connect_timeout.total_seconds()
        try:
            async with asyncio.timeout(seconds):
                return await asyncio.shield(opened)
        except TimeoutError:
            await self._drop(opened)
            raise MCPError(f"no answer in {seconds:g} s", self.server.label) from None

    async def _drop(self, opened: asyncio.Future[_Connection] | None) -> None:
        """Close the connection `opened` belongs to (any, if None), unless another already
        replaced it."""
        async with self._lock:
            if opened is None or opened is self._open:
                await self._close_locked()

    async def _close_locked(self) -> None:
        holder, self._holder, self._open = self._holder, None, None
        if holder is None:
            return
        self._stop.set()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(holder), 5.0)
        if not holder.done():
            holder.cancel()
            with contextlib.suppress(BaseException):
                await holder
        self._stop = asyncio.Event()

    async def _hold(self, opened: asyncio.Future[_Connection], stop: asyncio.Event) -> None:
        changed = asyncio.Event()
        try:
            async with (
                _connected(self.server, changed) as client,
                _listening(client, changed, self.server.label),
            ):
                # Listed once the changes are followed: none falls between the two.
                connection = _Connection(client, await _list_tools(client))
                opened.set_result(connection)
                await self._follow(connection, stop, changed)
        except BaseException as exc:  # told to its waiters, never lost
            if not opened.done():
                label = self.server.label
                error = exc if isinstance(exc, MCPError) else MCPError(_brief(exc), label)
                opened.set_exception(error)
                opened.exception()  # retrieved: no "never retrieved" when none waits
            elif not stop.is_set() and not isinstance(exc, asyncio.CancelledError):
                label = self.server.label
                log.warning("MCP server %s: the connection ended: %s", label, _brief(exc))
            if isinstance(exc, asyncio.CancelledError):
                raise

    async def _follow(
        self, connection: _Connection, stop: asyncio.Event, changed: asyncio.Event
    ) -> None:
        """List the tools again each time the server says they changed, until `stop`."""
        while True:
            await _first(stop.wait(), changed.wait())
            if stop.is_set():
                return
            changed.clear()
            connection.listing = await _list_tools(connection.client)
            names = ", ".join(sorted(t.name for t in connection.listing.tools))
            log.info("MCP server %s: its tools changed: %s", self.server.label, names)


async def _first(*waits: Coroutine[Any, Any, Any]) -> None:
    """Return once the first of `waits` has; the others are cancelled."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


@contextlib.asynccontextmanager
async def _listening(client: Client, changed: asyncio.Event, label: str) -> AsyncIterator[None]:
    """On 2026-07-28, a `subscriptions/listen` stream of tool list changes, each setting
    `changed`, acknowledged before the block runs and open while it does; earlier, the
    notifications do (`_connected`'s handler), unasked."""
    if client.session.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        yield
        return
    listening = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(_listen(client, changed, listening, label))
    try:
        await asyncio.wait([listening, task], return_when=asyncio.FIRST_COMPLETED)
        yield
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task


async def _listen(
    client: Client, changed: asyncio.Event, listening: asyncio.Future[None], label: str
) -> None:
    try:
        async with client.listen(tools_list_changed=True) as events:
            listening.set_result(None)
            async for _ in events:
                changed.set()
    except (MCPSDKError, SubscriptionLost, ListenNotSupportedError, TimeoutError) as exc:
        # A server that does not serve the stream: its tools are as first listed.
        log.info("MCP server %s: its tool list is not followed: %s", label, _brief(exc))
    finally:
        if not listening.done():
            listening.set_result(None)


def _usable(opened: asyncio.Future[_Connection], holder: asyncio.Task[None] | None) -> bool:
    if holder is None or holder.done():
        return False  # the connection ended
    return not opened.done() or (not opened.cancelled() and opened.exception() is None)


@contextlib.asynccontextmanager
async def _connected(server: MCPServer, changed: asyncio.Event) -> AsyncIterator[Client]:
    """A client of `server`; a handshake-era server's word that its tools changed sets
    `changed` (the holder lists them again: not here, on the session's receiving task)."""

    async def told(message: Any) -> None:
        if isinstance(message, mcp_types.ToolListChangedNotification):
            changed.set()

    if isinstance(server, MCPServerHTTP):
        async with create_mcp_http_client(
            headers=dict(server.headers),
            timeout=httpx2.Timeout(
                server.connect_timeout.total_seconds(), read=server.call_timeout.total_seconds()
            ),
        ) as http:
            transport = streamable_http_client(server.url, http_client=http)
            async with Client(transport, cache=None, message_handler=told) as client:
                yield client
    else:
        params = StdioServerParameters(
            command=server.command,
            args=list(server.args),
            env=dict(server.env) or None,
            cwd=server.cwd,
        )
        async with Client(params, cache=None, message_handler=told) as client:
            yield client


async def _list_tools(client: Client) -> Listing:
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    while True:
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return Listing(tuple(tools))


def _brief(exc: BaseException) -> str:
    """An exception in one line; an exception group by its first leaf (anyio's task groups
    wrap what failed in them)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_SESSIONS: dict[int, tuple[MCPServer, PerLoop[Session]]] = {}


async def session_of(server: MCPServer) -> Session:
    """The running loop's session with `server` (made at first use, closed with the loop)."""
    held = _SESSIONS.get(id(server))
    if held is None or held[0] is not server:
        held = (server, PerLoop(open=lambda: Session(server), close=lambda s: s.aclose()))
        _SESSIONS[id(server)] = held
    return await held[1].get()

"""A TCP proxy of a test's (or a benchmark's) own that makes a part go silent: no RST, no FIN.

It stands between relayq's processes and a real server (PostgreSQL, Redis) on a port of
its own, and does to the connections what a failover, a dropped route or a NAT table's
turnover does:

    with HangingProxy(upstream_port=5432) as proxy:
        env["RELAYQ_DATABASE_URL"] = f"postgresql+psycopg://...@127.0.0.1:{proxy.port}/db"
        proxy.black_hole()   # open connections carry nothing more; new ones are accepted
                             # and ignored
        proxy.black_hole(only=b"SUBSCRIBE")  # the open Redis pub/sub connections alone
        proxy.heal()         # new connections are forwarded again; those open during the
                             # hole stay silent for good, as a half-open connection does
        proxy.slow(2.0)      # every chunk held 2 s each way, on old and new connections
        proxy.fast()         # and no longer

It runs an asyncio loop in a thread of its own; every socket it opened is closed by
`close()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass, field
from types import TracebackType

from tests.ports import free_port

__all__ = ["HangingProxy"]

_CHUNK = 65536
_SAID = 65536
"""Bytes of what each client sent that a connection keeps, to be picked by."""


@dataclass
class _Pair:
    """One client's connection and its upstream's; `silent` once a black hole took it."""

    writers: list[asyncio.StreamWriter] = field(default_factory=list)
    silent: bool = False
    said: bytearray = field(default_factory=bytearray)
    """The first bytes the client sent (`black_hole(only=...)` picks connections by them)."""


class HangingProxy:
    """A TCP proxy on 127.0.0.1:`port` to 127.0.0.1:`upstream_port` (see the module)."""

    def __init__(self, upstream_port: int, *, port: int | None = None) -> None:
        self.upstream_port = upstream_port
        self.port = port or free_port()
        self._holing = False
        self._delay = 0.0
        self._pairs: list[_Pair] = []
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._call(self._start())

    def _call(self, coro: object) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)  # type: ignore[arg-type]

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    # -- what a test does ---------------------------------------------------------------------

    def black_hole(self, *, only: bytes | None = None) -> None:
        """Every open connection goes silent for good; new ones are accepted and ignored.
        `only`: just the open connections whose client has sent these bytes (b"SUBSCRIBE":
        a Redis pub/sub connection), new ones still carried."""
        self._loop.call_soon_threadsafe(self._hole, only)

    def heal(self) -> None:
        """New connections are forwarded again (the silent ones stay silent)."""
        self._loop.call_soon_threadsafe(setattr, self, "_holing", False)

    def slow(self, seconds: float) -> None:
        """Hold every chunk `seconds` before passing it on, each way: from the next chunk
        read once this returns."""
        self._call(self._set_delay(seconds))

    async def _set_delay(self, seconds: float) -> None:
        self._delay = seconds

    def fast(self) -> None:
        self.slow(0.0)

    def connections(self) -> int:
        """Client connections open through the proxy now, silent ones included."""
        return len(self._pairs)

    def close(self) -> None:
        if self._loop.is_closed():
            return
        with contextlib.suppress(Exception):
            self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> HangingProxy:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- inside the proxy's loop --------------------------------------------------------------

    def _hole(self, only: bytes | None) -> None:
        self._holing = only is None
        for pair in self._pairs:
            if only is None or only in pair.said:
                pair.silent = True

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for pair in list(self._pairs):
            for writer in pair.writers:
                writer.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pair = _Pair([writer], silent=self._holing)
        self._pairs.append(pair)
        try:
            if pair.silent:  # accepted and ignored: reads nothing, answers nothing
                await asyncio.Event().wait()
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            pair.writers.append(up_writer)
            await asyncio.gather(
                self._pipe(reader, up_writer, pair, said=pair.said),
                self._pipe(up_reader, writer, pair),
            )
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the proxy closing ends every pair: asyncio's server takes no cancelled one
        finally:
            self._pairs.remove(pair)
            for w in pair.writers:
                w.close()

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        pair: _Pair,
        said: bytearray | None = None,
    ) -> None:
        while True:
            chunk = await reader.read(_CHUNK)
            if said is not None and len(said) < _SAID:
                said += chunk[: _SAID - len(said)]
            if pair.silent:
                await asyncio.Event().wait()  # what it read goes nowhere, and nothing more
            if not chunk:
                writer.close()  # a FIN passed on: only while forwarding
                return
            if self._delay:
                await asyncio.sleep(self._delay)
                if pair.silent:
                    await asyncio.Event().wait()
            writer.write(chunk)
            await writer.drain()

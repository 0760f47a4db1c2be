"""relayq's `redis.asyncio` clients, each closed to the end on every path.

A client dropped open is a socket nobody closes, which redis-py 8.2 reports with a
ResourceWarning when it is collected, often in another test or after its loop ended.
Three things left them open: a close cut short by a second cancellation (asyncio.run
cancels every task as it ends, on top of the owner's own cancel, and redis-py re-raises
it from `PubSub.aclose` before the client is reached); a close whose sockets were still
to be let go by the loop's next turn when the loop ended; and a pool per event loop that
nothing closed when its loop ended (`relayq.perloop.PerLoop` closes those now).

`close_redis` closes a client to the end whatever cuts in; the caller still ends
cancelled, once the close is done.
`redis_pool` makes the per-loop pool that the limiter and the circuits share the shape of,
and `FailOpen` is how both do without Redis while it fails.
Every Redis connection of relayq's waits within `RedisBounds`, from the settings.
Each connection is named for its owner and process (`connection_name`), so an operator's
`CLIENT LIST` says which relayq process holds it.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import redis.asyncio as aioredis

from relayq.perloop import PerLoop
from tasks.settings import Settings

__all__ = [
    "DEFAULT_BOUNDS",
    "FailOpen",
    "RedisBounds",
    "close_redis",
    "connection_name",
    "redis_pool",
]

C = TypeVar("C")

SAY_EVERY = 30.0
"""Seconds between two log lines saying Redis still fails a part that does without it."""


@dataclass(frozen=True)
class RedisBounds:
    """How long one of relayq's Redis connections may keep its caller waiting: a command's
    answer, and a new connection's (`RELAYQ_BROKER_TIMEOUT`); TCP keepalives on it; and a
    PING first when it was left idle past the health check (`RELAYQ_BROKER_HEALTH_CHECK`),
    so a connection that went silent meanwhile is found before it is used.

    No `retry_on_timeout`: a command whose answer was late may have run, and a limiter's
    script or a publish sent again would count twice; the caller treats the timeout as
    an outage, where it knows what is safe to repeat."""

    timeout: float = 10.0
    health_check: float = 10.0

    @classmethod
    def of(cls, settings: Settings) -> RedisBounds:
        recovery = settings.recovery
        return cls(
            recovery.broker_timeout.total_seconds(), recovery.broker_health_check.total_seconds()
        )

    def options(self, url: str) -> dict[str, Any]:
        """redis-py's keyword arguments for a client on `url` (the same for its sync and
        asyncio clients): TCP keepalives only where there is TCP (not `unix://`, the
        embedded broker's socket, whose connections take no such argument)."""
        options: dict[str, Any] = {
            "socket_timeout": self.timeout,
            "socket_connect_timeout": self.timeout,
            "health_check_interval": max(1, round(self.health_check)),
        }
        if not url.startswith("unix:"):
            options["socket_keepalive"] = True
        return options


DEFAULT_BOUNDS = RedisBounds()
"""The settings' defaults, for a client made without settings (a test's, a tool's)."""


def connection_name(owner: str) -> str:
    """What `CLIENT LIST` calls a connection of `owner` in this process: `relayq-limiter-4711`."""
    return f"relayq-{owner}-{os.getpid()}"


def redis_pool(
    url: str, *, owner: str, max_connections: int, bounds: RedisBounds
) -> aioredis.Redis:
    """A client on a pool of at most `max_connections` (waiting up to the bound for a free
    one), its connections named for `owner`; closing the client closes the pool."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        client_name=connection_name(owner),
        max_connections=max_connections,
        timeout=bounds.timeout,
        **bounds.options(url),
    )
    return aioredis.Redis.from_pool(pool)


async def close_redis(client: aioredis.Redis, *pubsubs: Any) -> None:
    """Close `pubsubs`, then `client` and its pool (the pubsubs' connections too), to the
    end: each step runs though the one before failed (a broker gone away) or was cut
    short by a cancellation, and a cancellation met on the way is raised once all is done.

    The steps run in the caller's own task, and what a cancellation cut short is closed
    after them one connection at a time: a task of their own (redis-py closes a pool's
    connections in one task each) may be cancelled before its first step by a loop that
    is ending, which cancels every task it holds."""
    cancelled = False

    async def step(close: Callable[[], Awaitable[object]]) -> None:
        nonlocal cancelled
        try:
            await close()
        except asyncio.CancelledError:
            cancelled = True
        except Exception:
            pass  # closing what is already broken: nothing to keep

    for pubsub in pubsubs:
        await step(pubsub.aclose)
    await step(client.aclose)
    for connection in _connections_of(client.connection_pool):
        if connection.is_connected:
            # Its socket is closed before the first await: a cancellation cannot stop that.
            await step(functools.partial(connection.disconnect, nowait=True))
    # A closed transport lets go of its socket on the loop's next turn: take it here,
    # so a loop that ends next leaves no socket behind.
    for _ in range(2):
        await step(lambda: asyncio.sleep(0))
    if cancelled:
        raise asyncio.CancelledError


def _connections_of(pool: Any) -> list[Any]:
    """Every connection a redis-py pool made and holds, idle or in use."""
    held = [*getattr(pool, "_available_connections", ()), *getattr(pool, "_in_use_connections", ())]
    return held or list(getattr(pool, "_connections", ()))


class FailOpen(Generic[C]):
    """Redis for a part that does without it while it fails (the limiter's calls go
    unlimited, the circuits' as if closed): a connection per event loop (`PerLoop`),
    `down` for `retry_after` seconds after each failure, so that a part does not wait
    on a Redis that is away call after call, and `say_now` true at most once every
    `SAY_EVERY` seconds, for the log line that says so."""

    def __init__(
        self, open: Callable[[], C], *, client: Callable[[C], aioredis.Redis], retry_after: float
    ) -> None:
        self._conns = PerLoop(open=open, close=lambda conn: close_redis(client(conn)))
        self.retry_after = retry_after
        self._down_until = 0.0
        self._said = 0.0

    @property
    def down(self) -> bool:
        """Redis failed less than `retry_after` seconds ago: do without it."""
        return time.monotonic() < self._down_until

    def failed(self) -> None:
        """Redis failed now: do without it for `retry_after` seconds."""
        self._down_until = time.monotonic() + self.retry_after

    def say_now(self) -> bool:
        """Whether to log, now, that this part does without Redis."""
        now = time.monotonic()
        if now - self._said <= SAY_EVERY:
            return False
        self._said = now
        return True

    async def get(self) -> C:
        """The running loop's connection, made at its first use."""
        return await self._conns.get()

    def here(self) -> C | None:
        """The running loop's connection, if it has one."""
        return self._conns.here()

    async def aclose(self) -> None:
        """Close the running loop's connection."""
        await self._conns.aclose()

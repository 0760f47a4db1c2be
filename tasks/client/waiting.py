"""A client waiting on runs: woken by the workers' announcements, not by polling each run.

One `RunWaiter` per client and event loop serves every run waited on there:

- a subscriber on the announcement channel (`tasks.broker.announce`) marks the runs
  named as woken;
- a checker reads the status of every woken run that is waited on, in one
  statement (`store.settled_many`), and wakes the waiters of those settled;
- a fallback poll reads every run waited on, in one statement, every
  `recheck` seconds, and so does each (re)subscription: an announcement lost
  while the subscriber reconnected, or with a broker restarted empty, or one a
  worker could not send, never strands a waiter.

A run settled before its waiter arrived is found by the first read, which
every new wait asks for, unless the client was listening since before it last
changed the run and has not heard it announced since (the waiter remembers the
10,000 runs announced last). A wait that times out reads its run once more first:
it raises `WaitTimeout` only for a run still unsettled then.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from relayq import RelayqError
from store import StoreUnavailable, UnknownRun
from tasks.broker.announce import channel_of, decode
from tasks.broker.redis_clients import close_redis, connection_name
from tasks.settings import Settings
from tasks.storeio import StoreDoor

__all__ = ["RunWaiter", "WaitTimeout"]

log = logging.getLogger(__name__)

MAX_PAUSE = 2.0
"""Seconds between tries to subscribe again, at most."""
HEARD_KEPT = 10_000
"""Run ids a waiter remembers hearing announced, for waits that begin after their
announcement (the newest; a wait that began before all of them reads its run)."""


class WaitTimeout(RelayqError, TimeoutError):
    """A run did not settle within the time given."""

    def __init__(self, run_id: str, status: str, timeout: float) -> None:
        super().__init__(run_id, status, timeout)
        self.run_id = run_id
        self.status = status
        self.timeout = timeout

    def __str__(self) -> str:
        return f"run {self.run_id} is still {self.status} after {self.timeout:g} s"


class RunWaiter:
    """Waits on runs for one client on the running event loop (build it there)."""

    def __init__(self, settings: Settings, store: StoreDoor, *, recheck: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.store = store
        self.recheck = recheck
        self.channel = channel_of(settings)
        self._url = settings.redis_url
        self._broker_timeout = settings.recovery.broker_timeout.total_seconds()
        self._health_check = settings.recovery.broker_health_check.total_seconds()
        self._silent = False
        self._pause = 0.05
        self.subscription: int | None = None
        """The subscription announcements are heard on now (a number each time one
        starts); None while there is none."""
        self._subscriptions = 0
        self._heard = 0
        """What this waiter has heard so far: one more for each message (`mark`)."""
        self._subscribed_at = 0
        self._recent: dict[str, int] = {}
        """Run ids announced lately, oldest first, by the mark of their last announcement."""
        self._forgotten = 0
        """The newest mark no longer in `_recent`."""
        self._waiting: dict[str, list[asyncio.Future[None]]] = {}
        self._woken: set[str] = set()
        self._everything = False
        self._due = asyncio.Event()
        self._news = asyncio.Event()
        self._tasks = [_held(self.loop.create_task(self._check_forever()))]
        if self._url is not None:
            self._tasks.append(_held(self.loop.create_task(self._listen_forever(self._url))))
        self._timer = self.loop.call_later(recheck, self._tick)

    def mark(self) -> int | None:
        """Where this waiter's hearing stands now; None while it hears nothing. Taken
        before a change to a run (a start, an answer), it lets a wait on the run skip
        its first read (`wait`)."""
        return None if self.subscription is None else self._heard

    async def wait(
        self, run_id: str, timeout: float | None, *, heard_since: int | None = None
    ) -> None:
        """Return once `run_id` is settled; WaitTimeout after `timeout` seconds,
        UnknownRun for a run the store does not hold.

        `heard_since`: the `mark` taken before the caller's last change to the run
        committed. Whatever settled the run since was announced, and heard: unless the
        subscription changed or the run was announced since (before this wait began),
        no first read is needed.
        """
        future: asyncio.Future[None] = self.loop.create_future()
        self._waiting.setdefault(run_id, []).append(future)
        if not self._unheard_since(run_id, heard_since):
            self.wake([run_id])
        try:
            async with asyncio.timeout(timeout):
                await future
        except TimeoutError:
            # The last word is the store's: the run's announcement may be on its way.
            status, done = await self.store.settled(run_id)
            if not done:
                raise WaitTimeout(run_id, status, timeout or 0.0) from None
        finally:
            self._forget(run_id, future)

    def news(self) -> asyncio.Event:
        """An event set by the next announcement of any run, or the next subscription
        (what was announced meanwhile went unheard): a wait for work that any run's
        settling may bring (a host waiting to lease relay calls)."""
        return self._news

    def _unheard_since(self, run_id: str, mark: int | None) -> bool:
        """Whether `run_id` is sure to have gone unannounced since `mark`."""
        return (
            mark is not None
            and self.subscription is not None
            and self._subscribed_at <= mark
            and self._forgotten <= mark
            and self._recent.get(run_id, 0) <= mark
        )

    def wake(self, run_ids: Iterable[str]) -> None:
        """Read these runs' status at the next check (those waited on: an announcement
        names every run of the deployment that settles)."""
        waited = [run_id for run_id in run_ids if run_id in self._waiting]
        if waited:
            self._woken.update(waited)
            self._due.set()

    def wake_all(self) -> None:
        """Read every waited run's status at the next check."""
        self._everything = True
        self._due.set()

    def close(self) -> None:
        """Stop subscribing and checking (the subscriber closes its connection as it ends)."""
        self._timer.cancel()
        for task in self._tasks:
            if self.loop.is_closed():
                break
            if self.loop is _running_loop():
                task.cancel()
            else:
                self.loop.call_soon_threadsafe(task.cancel)

    async def aclose(self) -> None:
        """`close`, and wait until the subscriber has closed its connection."""
        self.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _forget(self, run_id: str, future: asyncio.Future[None]) -> None:
        futures = self._waiting.get(run_id)
        if futures is not None and future in futures:
            futures.remove(future)
            if not futures:
                del self._waiting[run_id]

    def _tick(self) -> None:
        if self._waiting:
            self.wake_all()
        self._timer = self.loop.call_later(self.recheck, self._tick)

    # -- the checker --------------------------------------------------------------------------

    async def _check_forever(self) -> None:
        while True:
            await self._due.wait()
            self._due.clear()
            if self._everything:
                ids = list(self._waiting)
            else:
                ids = [run_id for run_id in self._woken if run_id in self._waiting]
            self._everything = False
            self._woken.clear()
            if ids:
                await self._check(ids)

    async def _check(self, run_ids: list[str]) -> None:
        """One read of these runs; their waiters wake if settled (or hear why not)."""
        try:
            states = await self.store.settled_many(run_ids)
        except StoreUnavailable:
            # A store outage ends no wait: these runs are read again at the next recheck
            # (a wait with a timeout still ends then, with the store's word if it has one).
            self._woken.update(run_ids)
            return
        except Exception as exc:  # the waiters raise it, as a poll of their own would
            for run_id in run_ids:
                self._end(run_id, exc)
            return
        for run_id in run_ids:
            found = states.get(run_id)
            if found is None:
                self._end(run_id, UnknownRun(run_id))
            elif found[1]:
                self._end(run_id, None)

    def _end(self, run_id: str, error: Exception | None) -> None:
        for future in self._waiting.pop(run_id, []):
            if future.done():
                continue
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

    # -- the subscriber -----------------------------------------------------------------------

    async def _hear(self, pubsub: Any) -> None:
        """Take announcements until the connection fails. A quiet connection is asked for a
        PING each health check; one that answers nothing for two is silent (no RST, no FIN:
        a failover, a dropped route), and is given up for a new one."""
        check = self._health_check
        heard = self.loop.time()
        while True:
            message = await pubsub.get_message(timeout=check)
            _stop_if_cancelled()
            now = self.loop.time()
            if message is not None:
                heard = now
                self._take(message)
            elif now - heard > 2 * check:
                if not self._silent:
                    self._silent = True
                    log.warning("run announcements: the broker went silent; connecting again")
                raise _Silent
            elif now - heard >= check:
                await pubsub.ping()

    def _take(self, message: dict[str, Any]) -> None:
        if message["type"] in ("message", "subscribe"):
            self._news.set()
            self._news = asyncio.Event()
        if message["type"] == "message":
            run_ids = decode(message["data"])
            self._heard += 1
            self._remember(run_ids)
            self.wake(run_ids)
        elif message["type"] == "subscribe":
            # Whatever was announced before now went unheard.
            self._pause = 0.05
            self._heard += 1
            self._subscribed_at = self._heard
            self._subscriptions += 1
            self.subscription = self._subscriptions
            if self._silent:
                self._silent = False
                log.info("run announcements: the broker answers again")
            self.wake_all()

    def _remember(self, run_ids: list[str]) -> None:
        """Keep the newest announcements: a run announced between a change made by the
        host and the start of its wait would otherwise be missed by that wait."""
        for run_id in run_ids:
            self._recent.pop(run_id, None)
            self._recent[run_id] = self._heard
        while len(self._recent) > HEARD_KEPT:
            oldest = next(iter(self._recent))
            self._forgotten = self._recent.pop(oldest)

    async def _listen_forever(self, url: str) -> None:
        self._pause = 0.05
        while True:
            client = redis.asyncio.Redis.from_url(
                url,
                client_name=connection_name("waiter"),
                socket_connect_timeout=self._broker_timeout,
                socket_timeout=self._broker_timeout,
                retry=Retry(NoBackoff(), 0),
            )
            pubsub = client.pubsub()
            try:
                await pubsub.subscribe(self.channel)
                await self._hear(pubsub)
            except Exception as exc:  # the broker went away: subscribe again, read everything
                _stop_if_cancelled()
                log.debug("lost the run announcements (%s); subscribing again", type(exc).__name__)
            finally:
                self.subscription = None
                await close_redis(client, pubsub)
            await asyncio.sleep(self._pause)
            self._pause = min(self._pause * 2, MAX_PAUSE)


class _Silent(Exception):
    """The broker answered nothing, not even a PING, for two health checks."""


_HELD: set[asyncio.Task[None]] = set()
"""Every waiter's tasks until they end. A loop keeps only weak references to its tasks: a
waiter closed while its subscriber still closes its connection is dropped, and a task
waiting on a socket whose loop holds it only through that cycle could be collected midway,
its connection left open (a subscriber closed so, 'coroutine ignored GeneratorExit', was
seen under a loaded suite)."""


def _held(task: asyncio.Task[None]) -> asyncio.Task[None]:
    _HELD.add(task)
    task.add_done_callback(_HELD.discard)
    return task


def _stop_if_cancelled() -> None:
    """Raise CancelledError if this task was asked to stop: redis-py's pub/sub read can
    swallow the cancellation (seen when it lands as a subscription is confirmed)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None

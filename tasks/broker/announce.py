"""Announcing runs that may have settled, so hosts waiting on them wake at once.

A worker's turn, answer or cancel commits a run's new state to the store; then
its runtime's hooks hear of it (`tasks.hooks`), and `RunAnnouncer`, one of a
worker's hooks, publishes the run's id on a Redis pub/sub channel named with
the settings' key prefix, `<prefix>runs`; a waiting `DurableClient`
(`tasks.host.waiting`) is subscribed there and reads the run's status from the store.
An announcement carries ids only (space-separated in one message), never a
prompt, a result or a secret: the store is the only source of truth, and
whoever reads the channel learns only that a run moved.

Announcing is best effort, and must not slow a task: the announcing thread of
the process publishes, with one connection, reused, what was announced while it
was busy in one message; each publish is one try (reconnecting once, for a
connection the server closed); after a failure, silence for a few seconds. A
task only hands its run ids over, so a publish slowed by a busy machine costs
no turn any time, and a short timeout need not stand between the two.
A lost announcement costs a waiter its fallback poll, never its result.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from store import Database
from store.requests import run_of_request
from tasks.broker.peek import redis_url
from tasks.hooks import AnswerApplied, RunHooks, RunSettled
from tasks.settings import Settings

__all__ = ["Announcer", "RunAnnouncer", "channel_of", "decode", "encode"]

log = logging.getLogger(__name__)

QUIET_AFTER_FAILURE = 5.0
"""Seconds without trying again once a publish failed (the broker is likely down)."""
TIMEOUT = 2.0
"""Seconds one publish may take, connecting included (on the announcing thread)."""


def channel_of(settings: Settings) -> str:
    """The channel runs are announced on: the key prefix keeps deployments sharing a
    Redis apart (pub/sub channels ignore the db number)."""
    return f"{settings.key_prefix}runs"


def encode(run_ids: Iterable[str]) -> str:
    return " ".join(run_ids)


def decode(data: bytes | str) -> list[str]:
    """The run ids of one announcement."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return text.split()


class Announcer:
    """Publishes run ids from one process, on a thread of its own: one connection, one
    try, quiet after a failure.

    `announce` never raises and never waits; a failure is logged at debug level.
    """

    def __init__(self, settings: Settings) -> None:
        self.channel = channel_of(settings)
        url = redis_url(settings)
        self._client = (
            None
            if url is None
            else redis.Redis.from_url(
                url,
                socket_timeout=TIMEOUT,
                socket_connect_timeout=TIMEOUT,
                # One reconnection, for a connection the server closed since its last use.
                retry=Retry(NoBackoff(), 1),
            )
        )
        self._quiet_until = 0.0
        self._pending: list[str] = []
        self._busy = False
        """The thread is publishing: what is announced meanwhile goes with its next message."""
        self._lock = threading.Lock()
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="relayq-announce")

    def announce(self, run_ids: Sequence[str]) -> None:
        if self._client is None or not run_ids or time.monotonic() < self._quiet_until:
            return
        with self._lock:
            self._pending.extend(run_ids)
            if self._busy:
                return
            self._busy = True
        self._thread.submit(self._publish_pending)

    def _publish_pending(self) -> None:
        while True:
            with self._lock:
                run_ids, self._pending = self._pending, []
                if not run_ids:
                    self._busy = False
                    return
            if time.monotonic() < self._quiet_until:
                continue
            try:
                assert self._client is not None, "announce publishes nothing without a Redis"
                self._client.publish(self.channel, encode(run_ids))
            except Exception as exc:  # a waiter's fallback poll finds the run
                self._quiet_until = time.monotonic() + QUIET_AFTER_FAILURE
                log.debug("could not announce %d run(s): %s", len(run_ids), type(exc).__name__)

    def published(self, timeout: float = TIMEOUT * 2) -> None:
        """Return once what was announced before has been published (or given up)."""
        self._thread.submit(lambda: None).result(timeout)

    def close(self) -> None:
        with contextlib.suppress(TimeoutError):  # the broker hangs; nothing waits on it
            self.published()
        self._thread.shutdown(wait=False)
        if self._client is not None:
            self._client.close()


class RunAnnouncer(RunHooks):
    """A worker's hook: announces each run that settled (done, waiting on a request,
    ended, cancelled) and the run of each answer applied, which may have ended it
    (declining a budget does). A run whose next turn is queued, or that is sent
    again, is not announced: waiters would only read a status they do not wait for."""

    def __init__(self, settings: Settings, db: Database, io: Callable[..., Awaitable[Any]]) -> None:
        self.settings = settings
        self.db = db
        self.io = io
        """The runtime's store calls (`tasks.storeio`)."""
        self._announcer: Announcer | None = None

    def _announce(self, run_ids: Sequence[str]) -> None:
        if self._announcer is None:
            self._announcer = Announcer(self.settings)
        self._announcer.announce(run_ids)

    def after_run_settled(self, event: RunSettled) -> None:
        self._announce([event.run_id])

    async def after_answer_applied(self, event: AnswerApplied) -> None:
        if event.error is not None:
            return
        run_id = await self.io(run_of_request, self.db, event.request_id)
        if run_id is not None:
            self._announce([run_id])

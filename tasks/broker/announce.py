"""Announcing runs that may have settled, so hosts waiting on them wake at once.

A worker's turn, answer or cancel commits a run's new state to the store; then
its runtime's hooks hear of it (`tasks.hooks`), and `RunAnnouncer`, one of a
worker's hooks, publishes the run's id on a Redis pub/sub channel named with
the settings' key prefix, `<prefix>runs`; a waiting `DurableClient`
(`tasks.client.waiting`) is subscribed there and reads the run's status from the store.
An announcement carries ids only (space-separated in one message), never a
prompt, a result or a secret: the store is the only source of truth, and
whoever reads the channel learns only that a run moved.

Announcing is best effort, and must not slow a task: the announcing thread of
the process publishes, with one connection, reused, what was announced while it
was busy in one message (reconnecting once, for a connection the server
closed). A publish that fails (a broker away, or stalled past the timeout) is
tried again a few seconds on, with what was announced since: a short outage
delays the announcements, it does not lose them. A task only hands its run ids
over, so a publish slowed by a busy machine costs no turn any time. Only a
worker that dies or stops while publishing fails loses any, and a lost
announcement costs a waiter its fallback poll, never its result.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable, Sequence

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tasks.broker.redis_clients import RedisBounds
from tasks.hooks import AnswerApplied, RunHooks, RunSettled
from tasks.settings import Settings
from tasks.storeio import StoreDoor

__all__ = ["Announcer", "RunAnnouncer", "channel_of", "decode", "encode"]

log = logging.getLogger(__name__)

QUIET_AFTER_FAILURE = 5.0
"""Seconds before trying again once a publish failed (the broker is likely down or stalled)."""
HELD_AT_MOST = 10_000
"""Run ids kept for the next try while publishing fails; older ones are left to the
waiters' fallback poll."""
CLOSE_WAIT = 4.0
"""Seconds a closing announcer waits for what is pending to be published."""


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
    """Publishes run ids from one process, on a thread of its own: one connection, and
    after a failed publish, the same ids again (with what came since) `quiet` seconds on.

    `announce` never raises and never waits. A failure is logged once, as a warning,
    and the recovery once, as info.
    """

    def __init__(self, settings: Settings, *, quiet: float = QUIET_AFTER_FAILURE) -> None:
        self.channel = channel_of(settings)
        self.quiet = quiet
        url = settings.redis_url
        self._client = (
            None
            if url is None
            else redis.Redis.from_url(
                url,
                **RedisBounds.of(settings).options(url),
                # One reconnection, for a connection the server closed since its last use.
                retry=Retry(NoBackoff(), 1),
            )
        )
        self._pending: list[str] = []
        self._publishing = False
        self._failing = False
        self._closed = threading.Event()
        self._changed = threading.Condition()
        # A daemon: a process never waits at its exit on a broker that is away.
        self._thread = threading.Thread(target=self._publish_forever, daemon=True)
        self._thread.name = "relayq-announce"

    def announce(self, run_ids: Sequence[str]) -> None:
        if self._client is None or not run_ids:
            return
        with self._changed:
            self._hold(run_ids)
            if not self._thread.is_alive() and not self._closed.is_set():
                self._thread.start()
            self._changed.notify_all()

    def _hold(self, run_ids: Iterable[str]) -> None:
        self._pending.extend(run_ids)
        if len(self._pending) > HELD_AT_MOST:
            del self._pending[:-HELD_AT_MOST]

    def _publish_forever(self) -> None:
        assert self._client is not None, "announce publishes nothing without a Redis"
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._pending or self._closed.is_set())
                if not self._pending:
                    return
                # What was announced while the last publish was on its way goes in one.
                run_ids, self._pending = list(dict.fromkeys(self._pending)), []
                self._publishing = True
            try:
                self._client.publish(self.channel, encode(run_ids))
            except Exception as exc:  # held for the next try; a waiter's poll is the last resort
                self._published(failed=run_ids)
                if not self._failing:
                    self._failing = True
                    log.warning(
                        "could not announce %d run(s) (%s); trying again every %g s",
                        len(run_ids), type(exc).__name__, self.quiet,
                    )  # fmt: skip
                if self._closed.wait(self.quiet):
                    with self._changed:  # closing: no more tries
                        self._pending.clear()
                        self._changed.notify_all()
                    return
                continue
            self._published(failed=())
            if self._failing:
                self._failing = False
                log.info("announcing runs again")

    def _published(self, failed: Sequence[str]) -> None:
        with self._changed:
            self._pending[:0] = failed
            self._hold(())
            self._publishing = False
            self._changed.notify_all()

    def published(self, timeout: float = CLOSE_WAIT) -> None:
        """Return once what was announced before has been published (TimeoutError while
        publishing fails)."""
        with self._changed:
            if not self._changed.wait_for(lambda: not (self._pending or self._publishing), timeout):
                raise TimeoutError(f"{len(self._pending)} run(s) not announced yet")

    def close(self) -> None:
        """Publish what is pending, one try, and stop."""
        with self._changed:
            self._closed.set()
            self._changed.notify_all()
        with contextlib.suppress(TimeoutError):  # the broker hangs; nothing waits on it
            self.published()
        if self._client is not None:
            self._client.close()


class RunAnnouncer(RunHooks):
    """A worker's hook: announces each run that settled (done, waiting on a request,
    ended, cancelled) and the run of each answer applied, which may have ended it
    (declining a budget does). A run whose next turn is queued, or that is sent
    again, is not announced: waiters would only read a status they do not wait for."""

    on_loop = True  # quick, and made for the loop (`RunHooks.on_loop`)

    def __init__(self, settings: Settings, store: StoreDoor) -> None:
        self.settings = settings
        self.store = store
        """The runtime's door to the store."""
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
        run_id = await self.store.run_of_request(event.request_id)
        if run_id is not None:
            self._announce([run_id])

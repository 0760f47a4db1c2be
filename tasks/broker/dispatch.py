"""Where a change's messages go once the transaction that wrote them has committed.

A worker's runtime and a host's `DurableClient` hand every outbox row to one
`Dispatch`: `await dispatch(rows)`. `BrokerDispatch` sends them to the broker and
marks them sent; `tasks.client.eager.EagerDispatch` runs them in this process instead.

Sending blocks (the broker's socket, and its retries when the broker is away), so
it runs on a thread of its own, never behind the store's calls. Each hand-off
costs both threads a wakeup: what is dispatched while a batch is going out goes
with the next, in one hand-off. Marks wait `MARK_AFTER` for the marks of the
messages sent meanwhile, one write for many. A mark that never comes (the
process died) costs a duplicate message from a sweep, which changes nothing: a
message sent twice names the same task and claim.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor

from celery import Celery

from relayq.agents import Agent
from store import OutboxRow
from store.errors import safe_text
from store.outbox import mark_published
from tasks.broker.publish import batches_changed, send
from tasks.storeio import StoreDoor

__all__ = ["MARK_AFTER", "BrokerDispatch", "Dispatch", "Outgoing"]

log = logging.getLogger(__name__)

MARK_AFTER = 0.2
"""Seconds a sent message waits to be marked sent, with those sent meanwhile: one write
for many, and none between a run's start and its first turn."""


class Dispatch(ABC):
    """Takes the messages of committed changes: sent to workers, or run here."""

    @abstractmethod
    async def __call__(self, rows: list[OutboxRow]) -> int:
        """Dispatch `rows`; returns how many went to the broker."""

    @abstractmethod
    async def mark(self, rows: list[OutboxRow]) -> None:
        """Count `rows` as sent: they went another way (a task's retry of itself)."""

    def serve(self, agent: Agent) -> None:
        """Run `agent`'s turns when its messages come here, registered or not. A broker's
        workers find their agents by name: nothing to do."""
        return None

    async def batches_changed(self) -> None:
        """Say that a batch has new runs, so the workers taking batches consume its queue."""
        return None

    def close(self) -> None:
        """Write what is still owed (the marks not written yet) and let go of threads."""
        return None


class Outgoing:
    """`await outgoing(rows)` sends `rows` with `send` on `executor`, in batches, and returns
    those that went."""

    def __init__(
        self, send: Callable[[list[OutboxRow]], list[OutboxRow]], executor: Executor
    ) -> None:
        self._send = send
        self._executor = executor
        self._waiting: list[tuple[list[OutboxRow], asyncio.Future[list[OutboxRow]]]] = []
        self._drain: asyncio.Task[None] | None = None

    async def __call__(self, rows: list[OutboxRow]) -> list[OutboxRow]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[OutboxRow]] = loop.create_future()
        self._waiting.append((rows, future))
        if self._drain is None or self._drain.done() or self._drain.get_loop() is not loop:
            self._drain = loop.create_task(self._send_waiting())
        return await future

    async def _send_waiting(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting:
            batch, self._waiting = self._waiting, []
            rows = [row for rows, _ in batch for row in rows]
            try:
                sent = await loop.run_in_executor(self._executor, self._send, rows)
            except Exception as exc:  # `send` keeps its own errors; this is the unforeseen
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            went = {id(row) for row in sent}
            for rows_of, future in batch:
                if not future.done():
                    future.set_result([row for row in rows_of if id(row) in went])


class BrokerDispatch(Dispatch):
    """Sends to the broker with the app `sender()` gives, then marks what went.

    A row that does not go stays unsent in the store, for a sweep to send once the
    broker is back; it is logged, or handed to `on_unsent` when given (the CLI says
    it in one line).
    """

    def __init__(
        self,
        sender: Callable[[], Celery],
        store: StoreDoor,
        *,
        on_unsent: Callable[[list[OutboxRow]], None] | None = None,
    ) -> None:
        self._sender = sender
        self._store = store
        self.on_unsent = on_unsent
        # One thread: the loop hands it a batch at a time.
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="relayq-send")
        self._outgoing = Outgoing(self._send, self._thread)
        self._unmarked: list[OutboxRow] = []
        self._marker: asyncio.Task[None] | None = None

    def _send(self, rows: list[OutboxRow]) -> list[OutboxRow]:
        return send(self._sender(), rows, quiet=self.on_unsent is not None)

    async def __call__(self, rows: list[OutboxRow]) -> int:
        if not rows:
            return 0
        sent = await self._outgoing(rows)
        if self.on_unsent is not None and len(sent) < len(rows):
            went = {id(row) for row in sent}
            self.on_unsent([row for row in rows if id(row) not in went])
        await self.mark(sent)
        return len(sent)

    async def mark(self, rows: list[OutboxRow]) -> None:
        if not rows:
            return
        self._unmarked.extend(rows)
        loop = asyncio.get_running_loop()
        marker = self._marker
        if marker is None or marker.done() or marker.get_loop() is not loop:
            self._marker = loop.create_task(self._mark_soon())

    async def _mark_soon(self) -> None:
        while self._unmarked:
            await asyncio.sleep(MARK_AFTER)
            batch, self._unmarked = self._unmarked, []
            try:
                await self._store.mark_published(batch)
            except Exception as exc:
                # Kept for the next round: unmarked, a sweep would send them all again.
                self._unmarked[:0] = batch
                log.warning("could not mark %d messages sent: %s", len(batch), safe_text(exc))

    async def batches_changed(self) -> None:
        await asyncio.get_running_loop().run_in_executor(
            self._thread, batches_changed, self._sender()
        )

    def close(self) -> None:
        marker = self._marker
        if marker is not None and not marker.done():
            with contextlib.suppress(RuntimeError):  # no loop here: it ends with its own
                if marker.get_loop() is asyncio.get_running_loop():
                    marker.cancel()
        owed, self._unmarked = self._unmarked, []
        if owed:
            try:
                mark_published(self._store.db, owed)
            except Exception as exc:  # a sweep sends them again; the duplicates change nothing
                log.warning("could not mark %d messages sent: %s", len(owed), safe_text(exc))
        self._thread.shutdown(wait=True)

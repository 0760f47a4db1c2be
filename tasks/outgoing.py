"""Sending outbox rows from the event loop: in batches, one hand-off to a sending thread each.

Sending blocks (the broker's socket, and its retries when the broker is away), so it
runs off the loop. Each hand-off costs both threads a wakeup; a busy worker finishes
several turns while one batch is going out, and they all go with the next.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor

from store import OutboxRow

__all__ = ["Outgoing"]


class Outgoing:
    """`await outgoing(rows)` sends `rows` and returns those that went."""

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
        if self._drain is None or self._drain.done():
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

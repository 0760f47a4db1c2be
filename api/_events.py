"""Run and request changes, found by polling the store.

Each poll reads the runs updated in the last few seconds, and the requests
that are open, were answered in those seconds, or belong to those runs; it
compares their state with what the previous poll saw. Whatever moved is an
event. The window is wider than the poll interval, so a row written between
two polls (or by a worker whose clock is a little behind) is still read.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from fastapi.sse import ServerSentEvent
from sqlalchemy import or_
from sqlmodel import col, select

from store import Database, RequestRow, RunRow
from store.models import utcnow
from tasks import DurableClient

__all__ = ["Watcher", "event_stream"]

WINDOW = timedelta(seconds=5)


class Watcher:
    """What one stream has seen; `poll()` returns what changed since the last call."""

    def __init__(self, db: Database, *, run_id: str | None = None) -> None:
        self.db = db
        self.run_id = run_id
        self._runs: dict[str, tuple[Any, ...]] = {}
        self._requests: dict[str, tuple[Any, ...]] = {}

    def poll(self) -> list[ServerSentEvent]:
        runs, requests = self._read()
        # Requests first: an answer comes before the run it resumes moves on.
        events = [
            ServerSentEvent(event="request", data=_request_event(r))
            for r in requests
            if self._requests.get(r.id) != _request_state(r)
        ]
        events += [
            ServerSentEvent(event="run", data=_run_event(r))
            for r in runs
            if self._runs.get(r.id) != _run_state(r)
        ]
        # Keep only what the window still holds: the rest cannot change unseen.
        self._runs = {r.id: _run_state(r) for r in runs}
        self._requests = {r.id: _request_state(r) for r in requests}
        return events

    def _read(self) -> tuple[list[RunRow], list[RequestRow]]:
        since = utcnow() - WINDOW
        run_query = select(RunRow).where(col(RunRow.updated_at) >= since)
        request_query = select(RequestRow)
        if self.run_id is not None:
            run_query = run_query.where(RunRow.id == self.run_id)
            request_query = request_query.where(RequestRow.run_id == self.run_id)
        with self.db.read() as s:
            runs = list(s.exec(run_query))
            touched = [col(RequestRow.run_id).in_([r.id for r in runs])] if runs else []
            requests = list(
                s.exec(
                    request_query.where(
                        or_(
                            col(RequestRow.status) == "open",
                            col(RequestRow.answered_at) >= since,
                            *touched,
                        )
                    )
                )
            )
        return runs, requests


def _run_state(row: RunRow) -> tuple[Any, ...]:
    return (row.status, row.version, row.updated_at)


def _request_state(row: RequestRow) -> tuple[Any, ...]:
    return (row.status, row.revision)


def _run_event(row: RunRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "agent": row.agent,
        "status": row.status,
        "turns": row.turns,
        "updatedAt": row.updated_at.isoformat(),
    }


def _request_event(row: RequestRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "runId": row.run_id,
        "agent": row.agent,
        "kind": row.kind,
        "status": row.status,
        "answeredBy": row.answered_by,
        "answeredAt": row.answered_at.isoformat() if row.answered_at else None,
    }


async def event_stream(
    client: DurableClient, *, run_id: str | None = None, interval: float = 0.5
) -> AsyncIterator[ServerSentEvent]:
    """`ready` once the first poll has set the baseline, then `run` and `request` events.

    Ends when the client disconnects: the response cancels this generator. Each poll
    reads every open request: on a thread, whatever the store.
    """
    watcher = Watcher(client.db, run_id=run_id)
    await client.store.offload(watcher.poll)
    yield ServerSentEvent(event="ready", data={"runId": run_id}, retry=2000)
    while True:
        await asyncio.sleep(interval)
        for event in await client.store.offload(watcher.poll):
            yield event

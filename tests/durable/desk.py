"""The inbox's back office, for its tests: people in groups, and refunds waiting on them.

The `desk` agents (tests/durable/agents.py) take their refund's arguments from
the prompt, so each test tags its refunds with a word of its own (`note`) and
finds exactly them again by search, whatever else the session's store holds.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import timedelta
from typing import Any

import httpx
from sqlalchemy import delete
from sqlmodel import col

from relayq.approvals import APPROVAL_KIND
from relayq.relay import RELAY_KIND
from store.models import DecisionRow, RequestRow, RunRow, VoteRow, utcnow
from tasks import DurableClient
from tests.seeding import insert_rows, rows_like

from .conftest import ApiServer, Durable, Eventually
from .test_api import csrf_of

FAY, GIL, SID, VAL, SUE = "t0k-fay", "t0k-gil", "t0k-sid", "t0k-val", "t0k-sue"
DESK_TOKENS = (
    f"fay:approver:{FAY}:finance,gil:approver:{GIL}:finance|ops,"
    f"sid:approver:{SID}:support,val:viewer:{VAL},sue:submitter:{SUE}"
)


def new_tag() -> str:
    """A word no other test's refunds hold."""
    return f"tag{uuid.uuid4().hex[:10]}"


async def close_open(durable: Durable, tag: str) -> None:
    """Cancel the runs of `tag`'s refunds still open, which closes their requests at once
    (no turn to take, as a decline would), and check that nothing is left."""
    async with DurableClient(settings=durable.settings) as client:
        left = await client.requests("open", search=tag, all_pages=True)
        await asyncio.gather(*(client.cancel(r) for r in {s.run_id for s in left}))
        assert (await client.requests("open", search=tag, limit=1)).total == 0


def refund_prompt(tag: str, n: int, amount: float | None = None) -> str:
    return json.dumps({"order": f"{n:05d}", "amount": amount or 10 + n, "note": tag})


async def start_refunds(
    durable: Durable, tag: str, count: int, *, agent: str = "desk", amount: float | None = None
) -> list[str]:
    """Start `count` refunds tagged `tag`, in order (order 00000 first), as sue."""
    prompts = [refund_prompt(tag, n, amount) for n in range(count)]
    async with DurableClient(settings=durable.settings) as client:
        return await client.start_many(agent, prompts, started_by="sue")


async def waiting(
    api: ApiServer, tag: str, count: int, eventually: Eventually
) -> list[dict[str, Any]]:
    """The open requests tagged `tag`, oldest first, once all `count` are open."""
    async with api.http(VAL) as http:

        async def opened() -> list[dict[str, Any]] | None:
            params: dict[str, Any] = {"q": tag, "status": "open", "limit": 500}
            page = (await http.get("/api/requests", params=params)).json()
            return page["items"] if page["total"] == count else None

        found: list[dict[str, Any]] = await eventually(
            opened, timeout=120, what=f"{count} refunds tagged {tag} to wait"
        )
        return found


@asynccontextmanager
async def inbox_session(api: ApiServer, token: str) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """A browser-like HTTP client logged in to the inbox, and its pages' CSRF token."""
    async with api.http() as http:
        login = await http.get("/")
        res = await http.post("/login", data={"token": token, "csrf_token": csrf_of(login.text)})
        assert res.status_code == 303, res.text
        yield http, csrf_of((await http.get("/")).text)


def ids_of(items: list[dict[str, Any]]) -> list[str]:
    return [item["request"]["id"] for item in items]


def chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for at in range(0, len(items), size):
        yield items[at : at + size]


@contextmanager
def crowd(
    durable: Durable,
    tag: str,
    count: int,
    *,
    relay: int = 0,
    quorum: int = 2,
    approvers: list[str] | None = None,
) -> Iterator[list[str]]:
    """`count` open refund approvals tagged `tag` (after `relay` relay requests, older
    still, calling `lookup`), written straight to the store with a pending run each, as
    a full inbox holds them: no run takes a turn. Yields their ids, oldest first.

    Each approval needs `quorum` approvals, so with the default of 2 an approval in
    bulk is one vote each, and no run resumes: what a test may decide costs no worker
    anything. Every row the test made on them (votes, the audit trail) is removed after.
    """
    now = utcnow() - timedelta(hours=2)
    run = RunRow(id="", agent="desk", conversation_id="", status="pending", created_at=now,
                 updated_at=now)  # fmt: skip
    total = relay + count
    runs = rows_like(
        run, total, lambda n: {"id": f"run_{tag}_{n:05d}", "conversation_id": f"c_{tag}_{n:05d}"}
    )

    def request(n: int) -> dict[str, Any]:
        values: dict[str, Any] = {
            "id": f"req_{tag}_{n:05d}",
            "run_id": f"run_{tag}_{n:05d}",
            "created_at": now + timedelta(seconds=n),
        }
        if n < relay:
            call = {"id": f"call_{n}", "name": "lookup", "input": {"q": f"{tag} {n}"}}
            return values | {"kind": RELAY_KIND, "tool": "lookup", "calls": [call],
                             "prompt": f"Run lookup for the agent ({tag})"}  # fmt: skip
        arguments = {"order": f"{n:05d}", "amount": 10 + n, "note": tag}
        return values | {
            "kind": APPROVAL_KIND,
            "tool": "refund",
            "prompt": f"Refund order {n:05d} ({tag})?",
            "data": {"tool": "refund", "arguments": arguments},
            "approvers": approvers,
            "quorum": quorum,
        }

    template = RequestRow(id="", run_id="", agent="desk", kind="", prompt="", created_at=now)
    requests = rows_like(template, total, request)
    db = durable.db()
    try:
        insert_rows(db, RunRow, runs)
        insert_rows(db, RequestRow, requests)
        yield [r["id"] for r in requests]
    finally:
        ids, run_ids = [r["id"] for r in requests], [r["id"] for r in runs]
        with db.write() as s:
            for model, column, named in (
                (VoteRow, VoteRow.request_id, ids),
                (DecisionRow, DecisionRow.request_id, ids),
                (RequestRow, RequestRow.id, ids),
                (RunRow, RunRow.id, run_ids),
            ):
                s.execute(delete(model).where(col(column).in_(named)))
        db.dispose()

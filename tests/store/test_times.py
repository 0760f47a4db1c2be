"""Rule 15: the store keeps instants, in UTC, on both databases."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy.exc import StatementError

from relayq import BuiltinsConfig, Request, ToolContext, create_toolkit, define_tool
from store import Database, OutboxRow, Recovery, get_request, get_run, list_requests, sweep
from store.models import utcnow
from tests.relayq.scripted import calls

from .driver import halt_on_relay, model_of, outbox_rows, request_rows, run_turn, start

PLUS_FIVE_THIRTY = timezone(timedelta(hours=5, minutes=30))


def is_utc(value: datetime | None) -> bool:
    return value is not None and value.tzinfo is not None and value.utcoffset() == timedelta(0)


def add_outbox_row(
    db: Database, created_at: datetime, published_at: datetime | None = None
) -> None:
    with db.write() as s:
        s.add(
            OutboxRow(
                task="t", queue="q", args=[], created_at=created_at, published_at=published_at
            )
        )


async def test_every_stored_time_comes_back_aware_and_in_utc(db: Database):
    t0 = utcnow()
    await halt_on_relay(db, "c1", request_ttl=timedelta(minutes=5))

    run = get_run(db, "run_1")
    [row] = outbox_rows(db)
    [stored] = list_requests(db)
    times = [run.created_at, run.updated_at, row.created_at, stored.created_at,
             stored.request.expires_at, request_rows(db)[0].expires_at]  # fmt: skip
    assert all(is_utc(t) for t in times), times
    assert all(t0 <= t <= t0 + timedelta(minutes=6) for t in times if t is not None), times


def test_an_aware_time_in_another_zone_comes_back_as_the_same_instant_in_utc(db: Database):
    instant = datetime(2031, 6, 1, 12, 30, 15, 123456, tzinfo=PLUS_FIVE_THIRTY)
    add_outbox_row(db, created_at=instant, published_at=instant)

    [row] = outbox_rows(db)

    assert (row.created_at, row.published_at) == (instant, instant)
    assert is_utc(row.created_at)
    assert is_utc(row.published_at)
    assert (row.created_at.hour, row.created_at.minute, row.created_at.microsecond) == (
        7,
        0,
        123456,
    )


def test_times_compare_as_instants_whatever_zone_they_were_given_in(db: Database):
    # 12:00 at +05:30 is 06:30 UTC.
    add_outbox_row(db, created_at=datetime(2031, 6, 1, 12, 0, tzinfo=PLUS_FIVE_THIRTY))
    at = datetime(2031, 6, 1, 6, 30, tzinfo=UTC)

    grace = Recovery().outbox_grace
    assert sweep(db, now=at + grace - timedelta(seconds=1)).outbox == []
    later = (at + grace + timedelta(seconds=1)).astimezone(PLUS_FIVE_THIRTY)
    assert len(sweep(db, now=later).outbox) == 1


async def test_a_request_expiry_given_in_another_zone_comes_back_in_utc(db: Database):
    expires = datetime(2031, 6, 1, 12, 0, tzinfo=PLUS_FIVE_THIRTY)

    def ask(args: dict[str, Any], ctx: ToolContext) -> Request:
        return Request(kind="approval", prompt="May I?", expires_at=expires)

    kit = await create_toolkit(
        builtins=BuiltinsConfig.off(), extra_tools=[define_tool("ask", "asks", None, ask)]
    )
    start(db)
    turn = await run_turn(db, "run_1", kit, model_of(calls(("c1", "ask"))))
    assert turn.pending is not None

    stored = get_request(db, turn.pending.id)
    assert stored.request.expires_at == expires
    assert is_utc(stored.request.expires_at)


def test_a_naive_time_is_refused(db: Database):
    with pytest.raises(StatementError, match="naive datetime"):
        add_outbox_row(db, created_at=datetime(2031, 6, 1, 12, 0))

    assert outbox_rows(db) == []


def test_a_naive_moment_is_refused_by_the_sweeper(db: Database):
    start(db)

    with pytest.raises(StatementError, match="naive datetime"):
        sweep(db, now=datetime(2031, 6, 1, 12, 0))

"""Webhook deliveries in the store: fan-out, claims, the delivery log, backoff, giving up.

Time is passed in (`now=`), never slept.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import text

from store import Database
from store.events import emit
from store.models import DeliveryRow, utcnow
from store.webhooks import (
    FANOUT_MARGIN,
    NEW_ENDPOINT_BACKLOG,
    Attempt,
    RetryPolicy,
    Subscription,
    claim_due,
    delivery_log,
    fan_out,
    list_deliveries,
    record,
)
from tests.store.driver import statements

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=utcnow().tzinfo)
LEASE = timedelta(seconds=30)
EVERYTHING = Subscription(endpoint="ops")
OPENED_ONLY = Subscription(endpoint="chat", events=frozenset({"request.opened"}))


def events(db: Database, *types: str, at: datetime = T0) -> list[str]:
    """Record one event of each type (run_1, req_1) at `at`; their ids."""
    with db.transaction() as conn:
        return [
            emit(conn, t, run_id="run_1", request_id="req_1", now=at, agent="a")  # type: ignore[arg-type]
            for t in types
        ]


def deliveries(db: Database) -> list[DeliveryRow]:
    return sorted(list_deliveries(db, limit=100_000), key=lambda d: d.id or 0)


def failed(delivery_id: int, status: int | None = 503, **kw) -> Attempt:
    return Attempt(delivery_id=delivery_id, status=status, error=f"HTTP {status}", **kw)


# -- fan-out ----------------------------------------------------------------------------------


def test_each_event_fans_out_once_to_every_endpoint_that_wants_it(db: Database):
    opened, finished = events(db, "request.opened", "run.finished")

    made = fan_out(db, [EVERYTHING, OPENED_ONLY], now=T0)
    again = fan_out(db, [EVERYTHING, OPENED_ONLY], now=T0 + timedelta(seconds=1))

    assert (made, again) == (3, 0)
    pairs = {(d.endpoint, d.event_id) for d in deliveries(db)}
    assert pairs == {("ops", opened), ("ops", finished), ("chat", opened)}
    assert {(d.state, d.attempts, d.next_at) for d in deliveries(db)} == {("pending", 0, T0)}


def test_an_event_stamped_before_the_cursor_but_committed_after_it_still_fans_out(db: Database):
    # Given an endpoint that has had an event fanned out
    events(db, "request.opened", at=T0)
    fan_out(db, [EVERYTHING], now=T0)

    # When an event stamped earlier (a slow transaction, another host's clock) commits after
    [late] = events(db, "run.finished", at=T0 - FANOUT_MARGIN / 2)

    # Then the next fan-out still finds it
    assert fan_out(db, [EVERYTHING], now=T0 + timedelta(seconds=1)) == 1
    assert late in {d.event_id for d in deliveries(db)}


def test_a_new_endpoint_starts_with_the_last_hour_not_the_whole_history(db: Database):
    [old] = events(db, "run.finished", at=T0 - NEW_ENDPOINT_BACKLOG - timedelta(minutes=1))
    [recent] = events(db, "run.finished", at=T0 - NEW_ENDPOINT_BACKLOG + timedelta(minutes=1))

    fan_out(db, [EVERYTHING], now=T0)

    assert [d.event_id for d in deliveries(db)] == [recent]
    assert old not in {d.event_id for d in deliveries(db)}


def test_an_endpoint_that_wants_one_type_keeps_its_cursor_across_other_events(db: Database):
    # Given a filtered endpoint whose last wanted event is days old
    events(db, "request.opened", at=T0)
    fan_out(db, [OPENED_ONLY], now=T0)
    later = T0 + timedelta(days=3)
    events(db, "run.finished", at=later)

    # When a wanted event comes days later, it is found; the others are not its
    [wanted] = events(db, "request.opened", at=later)
    assert fan_out(db, [OPENED_ONLY], now=later) == 1
    assert [d.event_id for d in deliveries(db)][-1] == wanted


def test_ten_thousand_events_fan_out_and_are_claimed_in_batches(db: Database):
    # Given 10,000 events, written the way a busy store writes them
    with db.transaction() as conn:
        for i in range(10_000):
            emit(conn, "run.finished", run_id=f"run_{i}", now=T0 + timedelta(microseconds=i))

    # When they fan out 1,000 at a time, and are claimed 500 at a time
    with statements(db) as fanning:
        made = [fan_out(db, [EVERYTHING], now=T0, limit=1000) for _ in range(11)]
    with statements(db) as claiming:
        claimed = [claim_due(db, ["ops"], lease=LEASE, now=T0, limit=500) for _ in range(21)]

    # Then every event has one delivery and is claimed once, a batch costing a few statements
    assert made == [1000] * 10 + [0]
    ids = [due.event.id for batch in claimed for due in batch]
    assert [len(batch) for batch in claimed] == [500] * 20 + [0]
    assert len(ids) == len(set(ids)) == 10_000
    assert len(fanning) <= 11 * 4
    assert len(claiming) <= 21 * 4


def test_a_batch_of_outcomes_is_recorded_in_a_few_statements(db: Database):
    events(db, *["run.finished"] * 200)
    fan_out(db, [EVERYTHING], now=T0)
    due = claim_due(db, ["ops"], lease=LEASE, now=T0, limit=200)

    with statements(db) as recording:
        record(db, [Attempt(delivery_id=d.delivery_id, status=200) for d in due], now=T0)

    assert len(recording) <= 5
    assert {d.state for d in deliveries(db)} == {"delivered"}
    assert len(delivery_log(db, limit=1000)) == 200


# -- claims -----------------------------------------------------------------------------------


def test_a_claimed_delivery_is_not_claimed_again_until_its_lease_runs_out(db: Database):
    [opened] = events(db, "request.opened")
    fan_out(db, [EVERYTHING], now=T0)

    [due] = claim_due(db, ["ops"], lease=LEASE, now=T0)
    during = claim_due(db, ["ops"], lease=LEASE, now=T0 + LEASE - timedelta(seconds=1))
    [after] = claim_due(db, ["ops"], lease=LEASE, now=T0 + LEASE)

    assert (due.event.id, due.attempt, due.endpoint) == (opened, 1, "ops")
    assert due.event.payload == {"runId": "run_1", "requestId": "req_1", "agent": "a"}
    assert (due.event.type, due.event.created_at) == ("request.opened", T0)
    assert during == []
    assert after.delivery_id == due.delivery_id


def test_deliveries_to_an_endpoint_no_longer_configured_are_left_alone(db: Database):
    events(db, "request.opened")
    fan_out(db, [EVERYTHING, OPENED_ONLY], now=T0)

    taken = claim_due(db, ["chat"], lease=LEASE, now=T0)

    assert [d.endpoint for d in taken] == ["chat"]
    assert claim_due(db, [], lease=LEASE, now=T0) == []
    assert {d.endpoint: d.state for d in deliveries(db)} == {"ops": "pending", "chat": "pending"}


def test_a_locked_delivery_is_skipped_by_another_sender(pg: Database):
    # Given two due deliveries, one of them locked by a sender in the middle of its claim
    events(pg, "request.opened", "run.finished")
    fan_out(pg, [EVERYTHING], now=T0)
    first, second = deliveries(pg)
    with pg.engine.connect() as holder, holder.begin():
        holder.execute(
            text("SELECT id FROM relayq_deliveries WHERE id = :id FOR UPDATE"), {"id": first.id}
        )

        # When another sender claims, it takes the other one and does not wait
        taken = claim_due(pg, ["ops"], lease=LEASE, now=T0)

    assert [d.delivery_id for d in taken] == [second.id]


# -- attempts, backoff, giving up -------------------------------------------------------------


def test_a_2xx_marks_the_delivery_delivered_and_logs_the_attempt(db: Database):
    [opened] = events(db, "request.opened")
    fan_out(db, [EVERYTHING], now=T0)
    [due] = claim_due(db, ["ops"], lease=LEASE, now=T0)

    record(
        db,
        [Attempt(delivery_id=due.delivery_id, status=204, duration=timedelta(milliseconds=12))],
        now=T0,
    )

    [delivery] = deliveries(db)
    assert (delivery.state, delivery.attempts, delivery.delivered_at) == ("delivered", 1, T0)
    assert claim_due(db, ["ops"], lease=LEASE, now=T0 + timedelta(days=1)) == []
    [line] = delivery_log(db, event_id=opened)
    assert (line.endpoint, line.attempt, line.status, line.error, line.at) == (
        "ops",
        1,
        204,
        None,
        T0,
    )
    assert line.duration_ms == 12


def test_failures_are_retried_with_a_doubling_jittered_backoff_up_to_the_cap(db: Database):
    events(db, "request.opened")
    fan_out(db, [EVERYTHING], now=T0)
    policy = RetryPolicy(attempts=100, base=timedelta(seconds=1), cap=timedelta(hours=1))
    now = T0
    waits = []
    for _ in range(15):
        [due] = claim_due(db, ["ops"], lease=LEASE, now=now)
        record(db, [failed(due.delivery_id)], policy=policy, now=now)
        [delivery] = deliveries(db)
        waits.append((delivery.next_at - now).total_seconds())
        now = delivery.next_at

    for attempt, wait in enumerate(waits, start=1):
        ceiling = min(3600.0, 2.0 ** (attempt - 1))
        assert ceiling * 0.5 <= wait <= ceiling, (attempt, wait)
    assert deliveries(db)[0].attempts == 15
    lines = delivery_log(db)
    assert [line.attempt for line in lines] == list(range(15, 0, -1))
    assert {(line.status, line.error) for line in lines} == {(503, "HTTP 503")}


def test_a_receivers_retry_after_is_waited_for_but_never_past_the_cap(db: Database):
    events(db, "request.opened", "run.finished")
    fan_out(db, [EVERYTHING], now=T0)
    soon, late = claim_due(db, ["ops"], lease=LEASE, now=T0)
    policy = RetryPolicy(cap=timedelta(minutes=10))

    record(
        db,
        [
            failed(soon.delivery_id, 429, retry_after=timedelta(seconds=90)),
            failed(late.delivery_id, 429, retry_after=timedelta(days=2)),
        ],
        policy=policy,
        now=T0,
    )

    waits = [(d.next_at - T0).total_seconds() for d in deliveries(db)]
    assert waits == [90, 600]


def test_a_delivery_is_given_up_after_its_last_attempt(db: Database):
    [opened] = events(db, "request.opened")
    fan_out(db, [EVERYTHING], now=T0)
    policy = RetryPolicy(attempts=3, base=timedelta(seconds=1))
    now = T0
    for _ in range(3):
        [due] = claim_due(db, ["ops"], lease=LEASE, now=now)
        record(
            db, [Attempt(delivery_id=due.delivery_id, error="ConnectError")], policy=policy, now=now
        )
        now += timedelta(hours=2)

    [delivery] = deliveries(db)
    assert (delivery.state, delivery.attempts, delivery.last_error) == ("failed", 3, "ConnectError")
    assert claim_due(db, ["ops"], lease=LEASE, now=now + timedelta(days=30)) == []
    assert [d.id for d in list_deliveries(db, state="failed")] == [delivery.id]
    assert len(delivery_log(db, event_id=opened, endpoint="ops")) == 3


def test_a_late_success_wins_over_a_failure_of_the_same_delivery(db: Database):
    # Given a delivery whose lease ran out mid-send, so two senders tried it
    events(db, "request.opened")
    fan_out(db, [EVERYTHING], now=T0)
    [first] = claim_due(db, ["ops"], lease=LEASE, now=T0)
    [second] = claim_due(db, ["ops"], lease=LEASE, now=T0 + LEASE)
    assert first.delivery_id == second.delivery_id

    # When one succeeds and the slower one fails afterwards
    record(db, [Attempt(delivery_id=second.delivery_id, status=200)], now=T0 + LEASE)
    record(db, [failed(first.delivery_id)], now=T0 + LEASE * 2)

    # Then the delivery stays delivered, and the log holds both attempts
    [delivery] = deliveries(db)
    assert (delivery.state, delivery.delivered_at) == ("delivered", T0 + LEASE)
    assert [(line.attempt, line.status) for line in delivery_log(db)] == [(2, 503), (1, 200)]

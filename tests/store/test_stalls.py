"""A PostgreSQL connection gone silent gives its call back (issue 37): a round trip that
waits past `RELAYQ_STORE_SILENT_AFTER` has its connection cut and the call raises
StoreUnavailable; a statement that only runs long is the server's to cancel
(`statement_timeout`), and one run unbounded is neither. Through a proxy of the test's
own (`bench.hanging_proxy`) in front of this session's database."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import text
from sqlalchemy.engine import make_url

from bench.hanging_proxy import HangingProxy
from store import Database, StoreUnavailable, WorkerRow
from store.db import Bounds
from store.stalls import PING_AFTER_IDLE, StallWatch
from tasks.observability.metrics import observe_store_calls
from tasks.runner.heartbeat import Heartbeat
from tests.waiting import until

pytestmark = pytest.mark.postgres


@dataclass
class Proxied:
    db: Database
    proxy: HangingProxy


def _bounds(monkeypatch: pytest.MonkeyPatch, *, statement: float, silent: float) -> None:
    monkeypatch.setenv("RELAYQ_STORE_STATEMENT_TIMEOUT", str(statement))
    monkeypatch.setenv("RELAYQ_STORE_SILENT_AFTER", str(silent))


@pytest.fixture
def proxied(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Proxied]:
    """This session's database through a proxy that can go silent: statements bounded at
    1 s, round trips cut at 4 s."""
    url = request.getfixturevalue("postgres_url")
    if url is None:
        request.getfixturevalue("machine_parts").missing("postgres", "no PostgreSQL answers")
    parsed = make_url(url)
    _bounds(monkeypatch, statement=1, silent=4)
    with HangingProxy(parsed.port or 5432) as proxy:
        db = Database(parsed.set(host="127.0.0.1", port=proxy.port).render_as_string(False))
        try:
            yield Proxied(db, proxy)
        finally:
            db.dispose()


def _select(db: Database, sql: str = "SELECT 1") -> object:
    with db.read() as session:
        return session.execute(text(sql)).scalar()


def _in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """`call` on a thread of its own; its result or error lands in the list."""
    ended: list[object] = []

    def run() -> None:
        try:
            ended.append(call())
        except Exception as exc:
            ended.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, ended


def _ended(thread: threading.Thread, ended: list[object]) -> object:
    # Bounded only so a test that breaks says so: nothing but the cut ends the call.
    thread.join(30)
    if thread.is_alive():
        pytest.fail("the call on the silent connection never came back")
    return ended[0]


def test_a_statement_on_a_connection_gone_silent_is_cut_and_the_store_is_unavailable(
    proxied: Proxied, caplog: pytest.LogCaptureFixture
):
    # Given a store that answered
    caplog.set_level(logging.INFO, logger="store.stalls")
    assert _select(proxied.db) == 1

    # When its connections go silent (no RST, no FIN) under a statement
    proxied.proxy.black_hole()
    thread, ended = _in_thread(lambda: _select(proxied.db, "SELECT 2"))
    stalls = proxied.db.stalls
    assert stalls is not None
    until(lambda: stalls.oldest() >= 1, what="the wait seen as the oldest store call's")

    # Then the call comes back past the bound as an outage, and the log says so once
    raised = _ended(thread, ended)
    assert isinstance(raised, StoreUnavailable), raised
    assert stalls.oldest() == 0

    # And once new connections are answered again, the next call is served, and said
    proxied.proxy.heal()
    assert _select(proxied.db, "SELECT 3") == 3
    said = [r.getMessage() for r in caplog.records if r.name == "store.stalls"]
    assert said == [
        "the store went silent: cut 1 connection(s) waiting over 4 s on it",
        "the store answers again",
    ]


def test_the_oldest_store_calls_wait_is_a_metric(proxied: Proxied):
    # Given a process that observes its store calls
    observe_store_calls(proxied.db)
    assert _select(proxied.db) == 1

    def waited() -> float:
        value = REGISTRY.get_sample_value("relayq_store_call_wait_seconds", {"store": "postgresql"})
        return value or 0.0

    # When a call waits on a silent connection, the metric counts its seconds up
    proxied.proxy.black_hole()
    thread, ended = _in_thread(lambda: _select(proxied.db, "SELECT 2"))
    until(lambda: waited() >= 2, what="the metric to count the wait")

    # And back to 0 once the call was cut
    assert isinstance(_ended(thread, ended), StoreUnavailable)
    until(lambda: waited() == 0, what="the metric back to 0")


def test_a_pooled_connection_gone_silent_while_idle_is_found_at_checkout(proxied: Proxied):
    # Given a connection back in the pool after a call, idle past the ping's window
    assert _select(proxied.db) == 1
    time.sleep(PING_AFTER_IDLE + 0.1)

    # When it goes silent while idle, and new connections are answered again
    proxied.proxy.black_hole()
    proxied.proxy.heal()

    # Then the next call is served on a new connection: the pool's ping on the silent one
    # was cut, and the pool connected again
    thread, ended = _in_thread(lambda: _select(proxied.db, "SELECT 2"))
    assert _ended(thread, ended) == 2


def test_a_connection_that_answered_a_moment_ago_is_not_pinged_at_checkout(
    pg: Database, monkeypatch: pytest.MonkeyPatch
):
    # Given the store's pings counted, and a connection that answered just now
    dialect = pg.engine.dialect
    pings: list[object] = []

    def ping(dbapi_conn: Any) -> bool:
        pings.append(dbapi_conn)
        return type(dialect).do_ping(dialect, dbapi_conn)

    monkeypatch.setattr(dialect, "do_ping", ping)
    assert _select(pg) == 1

    # When calls follow one another within the window, each on that connection
    for n in range(5):
        assert _select(pg, f"SELECT {n}") == n

    # Then none of their checkouts pinged it: the ping would be a round trip more each
    assert pings == []

    # And one after the connection idled past the window pings it once
    time.sleep(PING_AFTER_IDLE + 0.1)
    assert _select(pg, "SELECT 9") == 9
    assert len(pings) == 1


def test_a_statement_that_runs_long_is_cancelled_by_the_server_not_cut(
    proxied: Proxied, caplog: pytest.LogCaptureFixture
):
    # Given a statement bound of 1 s
    caplog.set_level(logging.INFO, logger="store.stalls")

    # When a statement runs past it on a healthy connection
    with pytest.raises(StoreUnavailable) as raised:
        _select(proxied.db, "SELECT pg_sleep(3)")

    # Then the server cancelled it, and no connection was cut
    assert "timeout" in raised.value.reason
    assert not [r for r in caplog.records if r.name == "store.stalls"]
    assert _select(proxied.db, "SELECT pg_sleep(0.5)::text") == ""


def test_an_unbounded_statement_is_neither_cancelled_nor_cut(proxied: Proxied):
    # When a statement run unbounded (a migration's) takes longer than both bounds
    with proxied.db.unbounded.connect() as conn:
        slept = conn.execute(text("SELECT pg_sleep(5)::text")).scalar()

    # Then it ran to its end
    assert slept == ""


def test_every_postgresql_connection_carries_a_statement_and_an_idle_timeout(pg: Database):
    show = text("SELECT current_setting('statement_timeout'), "
                "current_setting('idle_in_transaction_session_timeout')")  # fmt: skip
    with pg.read() as session:
        assert tuple(session.execute(show).one()) == ("15s", "20s")
    with pg.unbounded.connect() as conn:
        assert tuple(conn.execute(show).one()) == ("0", "0")
    with pg.read() as session:  # the lift was the unbounded transaction's only
        assert tuple(session.execute(show).one()) == ("15s", "20s")


def test_a_transaction_whose_client_went_silent_frees_its_locks(
    proxied: Proxied, postgres_url: str
):
    # Given a lock held by a transaction whose connection then goes silent
    raw = proxied.db.engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute("SELECT pg_advisory_xact_lock(7734)")
        proxied.proxy.black_hole()

        # Then another connection takes the lock once the silence bound has passed
        direct = Database(postgres_url)
        try:
            with direct.unbounded.connect() as conn:
                taken = conn.execute(text("SELECT pg_advisory_xact_lock(7734)::text")).scalar()
            assert taken == ""
        finally:
            direct.dispose()
    finally:
        raw.invalidate()
        raw.close()


def test_a_silence_bound_not_above_the_statement_timeout_is_refused(
    monkeypatch: pytest.MonkeyPatch,
):
    _bounds(monkeypatch, statement=20, silent=20)
    with pytest.raises(ValueError, match=r"RELAYQ_STORE_SILENT_AFTER .* must be longer than"):
        Bounds.from_env()


@contextmanager
def _lost_call(db: Database) -> Iterator[tuple[StallWatch, Any]]:
    """A connection waiting on a command whose reply nobody will ever read: a call the
    cut cannot bring back. Yields the watch and the driver's connection."""
    stalls = db.stalls
    assert stalls is not None
    raw = db.engine.raw_connection()
    try:
        driver = raw.driver_connection
        driver.pgconn.send_query(b"SELECT 1")  # type: ignore[union-attr]
        stalls.began(driver)
        yield stalls, driver
    finally:
        raw.invalidate()
        raw.close()


def test_a_call_that_does_not_come_back_once_cut_is_wedged(proxied: Proxied):
    with _lost_call(proxied.db) as (stalls, driver):
        # It is cut past the bound, and the process counts as wedged a bound later
        assert not stalls.wedged()
        until(stalls.wedged, timeout=20, what="the call counted as wedged")

        # And no longer once the call is gone
        stalls.ended(driver)
        assert not stalls.wedged()


def test_a_wedged_process_beats_no_more_until_its_call_comes_back(proxied: Proxied):
    # Given a worker process's heartbeat on the proxied store
    heart = Heartbeat(proxied.db, "w1", every=0.1, timeout=5.0)
    heart.start()
    try:
        # When one of its calls cannot be brought back
        with _lost_call(proxied.db) as (stalls, driver):
            until(stalls.wedged, timeout=20, what="the call counted as wedged")

            # Then its heartbeat stands still, and counts as unsteady
            stood = _beaten_at(proxied.db, "w1")
            time.sleep(0.5)
            assert _beaten_at(proxied.db, "w1") == stood
            assert not heart.steady()

            # And it beats again once the call is gone
            stalls.ended(driver)
            until(lambda: _beaten_at(proxied.db, "w1") != stood, what="a new beat")
    finally:
        heart.stop()


def _beaten_at(db: Database, worker: str) -> object:
    with db.read() as session:
        row = session.get(WorkerRow, worker)
        return None if row is None else row.heartbeat_at

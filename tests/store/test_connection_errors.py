"""Every connection-class error is an outage to wait out, never a run's failure (issue 37):
by its class, and on the wire against a server that accepts and never answers."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import errors
from sqlalchemy import text
from sqlalchemy.exc import DisconnectionError, IntegrityError, OperationalError

from store import Database, StoreUnavailable
from store.db import unavailable

ADDRESS = "postgresql://127.0.0.1:5432/relayq"


def _wrapped(orig: Exception) -> OperationalError:
    """The driver's error as SQLAlchemy hands it to the store."""
    return OperationalError("SELECT 1", {}, orig)


def _kind(value: object) -> str:
    return type(getattr(value, "orig", value)).__name__ if isinstance(value, Exception) else ""


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (_wrapped(errors.ConnectionTimeout("connection timeout expired")), "timed out"),
        (_wrapped(errors.CancellationTimeout("cancellation timeout expired")), "timed out"),
        (_wrapped(errors.ConnectionFailure("server closed the connection")), "failed"),
        (_wrapped(errors.ConnectionException("connection exception")), "failed"),
        (_wrapped(errors.SqlclientUnableToEstablishSqlconnection("no")), "failed"),
        (_wrapped(errors.AdminShutdown("terminating connection")), "shutting down"),
        (_wrapped(errors.CannotConnectNow("the database system is starting up")), "starting"),
        (_wrapped(errors.QueryCanceled("canceling statement due to statement timeout")), "timeout"),
        (_wrapped(psycopg.OperationalError("consuming input failed: EOF")), "no connection"),
        (DisconnectionError("the pool's ping found the connection closed"), "lost"),
    ],
    ids=_kind,
)
def test_a_connection_class_error_is_an_outage_by_its_class(error: Exception, reason: str):
    found = unavailable(error, ADDRESS)
    assert isinstance(found, StoreUnavailable)
    assert reason in found.reason


def test_an_error_of_the_statement_itself_is_not_an_outage():
    refused = IntegrityError("INSERT", {}, errors.UniqueViolation("duplicate key"))
    assert unavailable(refused, ADDRESS) is None


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port whose server accepts every connection and never sends a byte: a PostgreSQL
    behind a route that went silent, or a proxy that hangs."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        yield server.getsockname()[1]


def test_a_store_that_accepts_and_never_answers_is_unavailable_within_the_connect_bound(
    silent_port: int, monkeypatch: pytest.MonkeyPatch
):
    # Given a store whose server accepts connections and answers nothing, and a bound of 2 s
    monkeypatch.setenv("RELAYQ_STORE_CONNECT_TIMEOUT", "2")
    db = Database(f"postgresql+psycopg://relayq@127.0.0.1:{silent_port}/relayq")
    try:
        # When a read is asked of it
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as raised, db.read() as session:
            session.execute(text("SELECT 1"))

        # Then it is an outage, said at the bound: not before it, nor at the 10 s default
        # (not a wait for good, not a failure)
        took = time.monotonic() - started
        assert "timed out" in raised.value.reason or "no connection" in raised.value.reason
        assert 1.5 <= took < 8, f"{took:.1f} s: the 2 s bound was not the one applied"
    finally:
        db.dispose()


def test_every_postgresql_connection_carries_its_bounds(pg: Database):
    # Given the store's engine, as every worker, API and CLI process builds it
    raw = pg.engine.raw_connection()
    try:
        # Then its connections were opened with keepalives, a user timeout and a
        # connect timeout, each the documented default
        params = raw.driver_connection.info.get_parameters()  # type: ignore[union-attr]
    finally:
        raw.close()
    assert params["connect_timeout"] == "10"
    assert params["keepalives"] == "1"
    assert params["keepalives_idle"] == "5"
    assert params["keepalives_count"] == "3"
    assert params["tcp_user_timeout"] == "20000"

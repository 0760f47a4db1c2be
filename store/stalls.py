"""Round trips to PostgreSQL that never come back: found, and their connection cut.

A connection whose peer went silent (no RST, no FIN: a failover, a dropped route, a
proxy or NAT that forgot it) leaves a statement waiting for good whenever something
on the way still acknowledges its packets, which TCP keepalives and
`tcp_user_timeout` then cannot see. A worker's turn would hang in that call, its
claim held and its heartbeat fresh, and nobody would take it over.

Every relayq statement carries a `statement_timeout` (`RELAYQ_STORE_STATEMENT_TIMEOUT`):
a server that answers at all answers within it. So a round trip still waiting past
`RELAYQ_STORE_SILENT_AFTER` seconds, longer than that, is on a silent connection, and
`StallWatch`'s thread shuts that connection's socket down: the driver raises a
connection error, the store call raises StoreUnavailable and the caller treats it as
the outage it is (a turn gives its claim back, its message goes back to the queue, no
try spent). Statements run `unbounded` (migrations, their lock) are never cut.

A round trip is each statement, the pool's ping at checkout, a commit, a rollback and
the pool's reset of a returned connection. The ping is skipped for a connection that
answered less than `PING_AFTER_IDLE` ago: under load every checkout would otherwise cost
a round trip more (about one a transaction); a connection gone silent within that window
is found by its next statement's bound instead, as one gone silent mid-transaction is.

A call still waiting well after its connection was cut (`wedged`) is one the process
cannot get back: the worker's heartbeat stops, so another worker's sweeper takes its
claims.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from psycopg.pq import TransactionStatus
from sqlalchemy import Engine, event
from sqlalchemy.exc import InvalidatePoolError

__all__ = ["PING_AFTER_IDLE", "UNBOUNDED", "StallWatch"]

log = logging.getLogger(__name__)

UNBOUNDED = "relayq_unbounded"
"""The execution option of statements no bound applies to (`Database.unbounded`)."""
_FRESH = "relayq_fresh"
_HEARD = "relayq_heard"

PING_AFTER_IDLE = 0.5
"""Seconds since a pooled connection last answered after which its checkout pings it."""


@dataclass
class _Trip:
    """A connection's round trip in flight: since when, on which socket."""

    pgconn: Any
    fd: int
    since: float
    exempt: bool = False
    cut_at: float | None = None


class StallWatch:
    """The round trips in flight on one engine's connections, and a thread that cuts the
    connection of one waiting past `bound` seconds (see the module)."""

    def __init__(
        self,
        engine: Engine,
        *,
        bound: float,
        every: float = 1.0,
        ping_after_idle: float = PING_AFTER_IDLE,
    ) -> None:
        self.bound = bound
        self.every = every
        self.ping_after_idle = ping_after_idle
        self._trips: dict[int, _Trip] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cut_since_answer = False
        self.on_tick: list[Callable[[float], None]] = []
        """Called with `oldest()` each `every` seconds, from the watch's thread (a metric)."""
        self._listen(engine)

    # -- what an operator and the heartbeat read -------------------------------------------

    def oldest(self) -> float:
        """Seconds the oldest round trip in flight has waited (0 with none)."""
        now = time.monotonic()
        with self._lock:
            waits = [now - t.since for t in self._trips.values() if _active(t.pgconn)]
        return max(waits, default=0.0)

    def wedged(self) -> bool:
        """Whether a call cut loose `bound` seconds ago or more has still not come back:
        the process holds a turn it cannot give back, and must not look alive."""
        now = time.monotonic()
        with self._lock:
            return any(
                t.cut_at is not None and now - t.cut_at >= self.bound for t in self._trips.values()
            )

    def close(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    # -- the round trips --------------------------------------------------------------------

    def began(self, dbapi_conn: Any, *, exempt: bool = False) -> None:
        pgconn = getattr(dbapi_conn, "pgconn", None)
        if pgconn is None:
            return
        try:
            fd = pgconn.socket
        except Exception:  # a lost connection: the round trip fails by itself
            return
        with self._lock:
            self._trips[id(dbapi_conn)] = _Trip(pgconn, fd, time.monotonic(), exempt)
        if self._thread is None:
            self._start()

    def ended(self, dbapi_conn: Any, *, answered: bool = False) -> None:
        with self._lock:
            self._trips.pop(id(dbapi_conn), None)
        if answered and self._cut_since_answer:
            self._cut_since_answer = False
            log.info("the store answers again")

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None or self._stop.is_set():
                return
            self._thread = threading.Thread(target=self._watch, name="relayq-stalls", daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(self.every):
            now = time.monotonic()
            with self._lock:
                stalled = [
                    t
                    for t in self._trips.values()
                    if not t.exempt
                    and t.cut_at is None
                    and now - t.since > self.bound
                    and _active(t.pgconn)
                ]
                # Cut under the lock: a trip still listed holds its connection, so its
                # socket is still the one it was when the trip began.
                for trip in stalled:
                    trip.cut_at = now
                    _shut_down(trip.fd)
            if stalled and not self._cut_since_answer:
                self._cut_since_answer = True
                log.warning(
                    "the store went silent: cut %d connection(s) waiting over %g s on it",
                    len(stalled), self.bound,
                )  # fmt: skip
            if self.on_tick:
                oldest = self.oldest()
                for hook in self.on_tick:
                    hook(oldest)

    # -- the engine's events ----------------------------------------------------------------

    def _listen(self, engine: Engine) -> None:
        self._engine = engine
        pool = engine.pool
        event.listen(pool, "connect", self._connected)
        event.listen(pool, "checkout", self._ping)
        event.listen(pool, "reset", self._reset)
        for name in ("checkin", "invalidate", "soft_invalidate", "close", "close_detached"):
            event.listen(pool, name, self._gone)
        event.listen(engine, "before_cursor_execute", self._before)
        event.listen(engine, "after_cursor_execute", self._after)
        event.listen(engine, "commit", self._ending)
        event.listen(engine, "rollback", self._ending)

    def _connected(self, _dbapi_conn: Any, record: Any) -> None:
        record.info[_FRESH] = True

    def _ping(self, dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        """The pool's pre-ping, as a round trip of the watch's: a pooled connection gone
        silent while idle is found here, before any statement is sent on it."""
        if record.info.pop(_FRESH, False):
            return
        heard = record.info.get(_HEARD)
        if heard is not None and time.monotonic() - heard < self.ping_after_idle:
            return  # it answered a moment ago (see the module)
        dialect = self._engine.dialect
        self.began(dbapi_conn)
        try:
            dialect.do_ping(dbapi_conn)
        except dialect.loaded_dbapi.Error as exc:
            # As SQLAlchemy's own pre-ping does: the pool's other connections, as old, are
            # likely lost too (a server restarted, a route dropped), and each would cost
            # its own wait.
            raise InvalidatePoolError("the pooled connection is lost") from exc
        else:
            record.info[_HEARD] = time.monotonic()
        finally:
            self.ended(dbapi_conn)

    def _reset(self, dbapi_conn: Any, _record: Any, _state: Any) -> None:
        self.began(dbapi_conn)

    def _before(self, conn: Any, *_args: Any) -> None:
        exempt = bool(conn.get_execution_options().get(UNBOUNDED))
        self.began(conn.connection.dbapi_connection, exempt=exempt)

    def _after(self, conn: Any, *_args: Any) -> None:
        fairy = conn.connection
        fairy.info[_HEARD] = time.monotonic()
        self.ended(fairy.dbapi_connection, answered=True)

    def _ending(self, conn: Any) -> None:
        # An invalidated connection (its round trip failed) sends nothing more; asking it
        # for its driver's connection would reconnect in the failed transaction.
        if not conn.invalidated:
            self.began(conn.connection.dbapi_connection)

    def _gone(self, dbapi_conn: Any, *_args: Any) -> None:
        if dbapi_conn is not None:
            self.ended(dbapi_conn)


def _active(pgconn: Any) -> bool:
    """Whether the connection waits on a command right now (a benign read of libpq's
    state from another thread)."""
    try:
        return bool(pgconn.transaction_status == TransactionStatus.ACTIVE)
    except Exception:
        return False


def _shut_down(fd: int) -> None:
    """Shut the socket down under the driver: its wait ends with a connection error. On a
    copy of the descriptor, so the driver's own is closed by the driver alone."""
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # closed meanwhile: the round trip ended by itself

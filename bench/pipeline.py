"""What psycopg's pipeline mode, and the pool's ping, cost a turn's end on PostgreSQL.

    python -m bench.pipeline                 # 3,000 ends of a turn, each way
    python -m bench.pipeline --ends 500

A turn's end is one transaction: the claim check and the run's new state (an UPDATE
with RETURNING), the turn's message, the next turn's outbox row (an INSERT with
RETURNING). The same statements on relayq's own tables, on the machine's PostgreSQL (a
database made for the run and dropped after), four ways, interleaved in rounds:

    sqlalchemy   as the store sends them today: SQLAlchemy on psycopg, each statement
                 its round trip, BEGIN and COMMIT theirs (5)
    pinged       the same, with the pool's ping at every checkout, as before issue 26's
                 lever (`store.stalls.PING_AFTER_IDLE`: now only after half a second idle) (6)
    psycopg      the same statements as plain psycopg calls (5 round trips)
    pipelined    psycopg's pipeline: BEGIN and the three statements sent at once, their
                 answers read after one sync, then COMMIT (2 round trips; the claim
                 check is read before the COMMIT is sent, as it must be)

The table shows the client's CPU and the wall time per end (one connection, one end at
a time): what a worker would save per turn on its I/O threads.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
from sqlalchemy import text

from bench.inflight import drop_postgres, postgres_url
from store import Database, RunSpec, create_run, migrate

__all__ = ["main"]

RUN = "run_pipeline"

_UPDATE = (
    "UPDATE relayq_runs SET version = version + 1, updated_at = %(now)s, attempts = 0, "
    "crashes = 0, error = NULL WHERE id = %(rid)s AND status = 'running' "
    "AND version = %(v)s RETURNING id, cancel_requested"
)
_MESSAGE = (
    "INSERT INTO relayq_messages (conversation_id, seq, run_id, role, body, prompt_tokens, "
    "completion_tokens, created_at) VALUES (%(conv)s, %(seq)s, %(rid)s, 'assistant', "
    "%(body)s, 0, 0, %(now)s)"
)
_OUTBOX = (
    "INSERT INTO relayq_outbox (task, queue, args, countdown, run_id, label, sends, "
    "created_at) VALUES ('relayq.run_turn', 'relayq.turns', %(args)s, 0, %(rid)s, "
    "%(label)s, 0, %(now)s) RETURNING id"
)
BODY = json.dumps({"role": "assistant", "content": "a reply of a few words " * 8})


class Ends:
    """The run's next end's parameters: its version and its message's place move on."""

    def __init__(self, version: int, seq: int, conversation: str) -> None:
        self.version, self.seq, self.conversation = version, seq, conversation

    def next(self) -> dict[str, Any]:
        values = {
            "rid": RUN,
            "v": self.version,
            "now": datetime.now(UTC),
            "conv": self.conversation,
            "seq": self.seq,
            "body": BODY,
            "args": json.dumps([RUN, self.version + 1]),
            "label": f"{RUN} bench turn {self.seq}",
        }
        self.version += 1
        self.seq += 1
        return values


def _text(statement: str) -> Any:
    return text(statement.replace("%(", ":").replace(")s", ""))


# Built once, as the store's statements are (`store.statements`): SQLAlchemy caches each
# one's compiled form.
_TEXTS = (_text(_UPDATE), _text(_MESSAGE), _text(_OUTBOX))


def by_sqlalchemy(db: Database, ends: Ends) -> None:
    update, message, outbox = _TEXTS
    values = ends.next()
    with db.transaction() as conn:
        assert conn.execute(update, values).first() is not None
        conn.execute(message, values)
        conn.execute(outbox, values).scalar_one()


def pinged(db: Database, ends: Ends) -> None:
    stalls = db.stalls
    assert stalls is not None
    window, stalls.ping_after_idle = stalls.ping_after_idle, 0.0
    try:
        by_sqlalchemy(db, ends)
    finally:
        stalls.ping_after_idle = window


def by_psycopg(conn: psycopg.Connection[Any], ends: Ends) -> None:
    values = ends.next()
    with conn.transaction():
        assert conn.execute(_UPDATE, values).fetchone() is not None
        conn.execute(_MESSAGE, values)
        assert conn.execute(_OUTBOX, values).fetchone() is not None


def pipelined(conn: psycopg.Connection[Any], ends: Ends) -> None:
    values = ends.next()
    with conn.pipeline() as pipeline:
        # psycopg's BEGIN goes with the first statement, all in one round trip ...
        held = conn.execute(_UPDATE, values)
        conn.execute(_MESSAGE, values)
        sent = conn.execute(_OUTBOX, values)
        pipeline.sync()
        # ... and the claim check is read before the transaction is settled: the second.
        ok = held.fetchone() is not None and sent.fetchone() is not None
        if ok:
            conn.commit()
        else:
            conn.rollback()
    assert ok


def timed(end: Callable[[], None], count: int) -> tuple[float, float]:
    """CPU and wall microseconds per end."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(count):
        end()
    return (
        1e6 * (time.process_time() - cpu) / count,
        1e6 * (time.perf_counter() - wall) / count,
    )


def measure(db: Database, ends: int, rounds: int = 5) -> dict[str, list[tuple[float, float]]]:
    """Each way's (CPU, wall) microseconds per end, a pair a round, on migrated store `db`
    (PostgreSQL), whose run `RUN` it makes."""
    create_run(db, RunSpec("bench"), run_id=RUN, prompt="go")
    with db.transaction() as conn:
        version, conversation = conn.execute(
            text(
                "UPDATE relayq_runs SET status = 'running' WHERE id = :rid "
                "RETURNING version, conversation_id"
            ),
            {"rid": RUN},
        ).one()
    run = Ends(version, 1000, conversation)
    raw = psycopg.connect(db.url.replace("postgresql+psycopg://", "postgresql://"))
    try:
        ways: dict[str, Callable[[], None]] = {
            "sqlalchemy": lambda: by_sqlalchemy(db, run),
            "pinged": lambda: pinged(db, run),
            "psycopg": lambda: by_psycopg(raw, run),
            "pipelined": lambda: pipelined(raw, run),
        }
        for way in ways.values():  # warm: connections made, statements prepared
            timed(way, 10)
        figures: dict[str, list[tuple[float, float]]] = {w: [] for w in ways}
        for _ in range(rounds):
            for label, way in ways.items():
                figures[label].append(timed(way, max(1, ends // rounds)))
        return figures
    finally:
        raw.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ends", type=int, default=3000, help="ends of a turn, each way")
    parser.add_argument("--rounds", type=int, default=5, help="rounds the ways alternate in")
    args = parser.parse_args(argv)
    name = f"relayq_bench_pipeline_{os.getpid()}"
    url = postgres_url(name)
    if url is None:
        raise SystemExit("bench.pipeline: no PostgreSQL server answers")
    db = Database(url)
    try:
        migrate(db)
        figures = measure(db, args.ends, args.rounds)
    finally:
        db.dispose()
        drop_postgres(name)
    print_table(figures, args.ends)


def print_table(figures: dict[str, list[tuple[float, float]]], ends: int) -> None:
    def median(xs: list[float]) -> float:
        return sorted(xs)[len(xs) // 2]

    base_cpu = median([c for c, _ in figures["sqlalchemy"]])
    base_wall = median([w for _, w in figures["sqlalchemy"]])
    print(f"\na turn's end on PostgreSQL, {ends} each way, medians of the rounds\n")
    print("| way | round trips | client CPU µs/end | vs sqlalchemy | wall µs/end | vs sqlalchemy |")
    print("|---|---:|---:|---:|---:|---:|")
    trips = {"sqlalchemy": 5, "pinged": 6, "psycopg": 5, "pipelined": 2}
    for way, rows in figures.items():
        cpu, wall = median([c for c, _ in rows]), median([w for _, w in rows])
        print(f"| {way} | {trips[way]} | {cpu:.0f} | {cpu / base_cpu:.2f}x | {wall:.0f} "
              f"| {wall / base_wall:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()

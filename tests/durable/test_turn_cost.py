"""What a turn costs, as counts (issue 38): the store transactions, statements and commits,
the Redis commands and the bytes of a turn message of one three-turn run with a local tool,
on a real worker, on SQLite and on PostgreSQL. Each is held to a ceiling, by its shape (a
statement's verb and table, a command's name and key), so an added statement or command
fails here, named.

The run is the second one the worker takes: the first makes the connections, loads the
scripts and declares the queues, which a worker does once, not per turn. Periodic work is
pushed out of the window (heartbeats, sweeps, batch polls); what it costs is counted on its
own. Redis is a server of the module's own, watched with MONITOR; the store's calls are
recorded inside the worker (`tests.durable.store_counter`).
"""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from sqlalchemy import event

from bench.model_server import ServerProcess
from store import Database, StoreBusy, beat, get_run, migrate
from store.db import impatient
from tasks import DurableClient, Settings
from tests.brokers import PrivateRedis
from tests.ports import free_port

from .conftest import Worker
from .store_counter import LOCKED, SWITCH, shape, store_calls

ONE_LANE = True  # tests/conftest.py: the worker's runs, once (per store) for the module's tests

TURNS = 3

# Each shape's most in one three-turn run, and what it is for. Three turns: three claims,
# two model calls recorded (the third, the answer, goes with its turn's finish), three
# finishes; and the sent-marks of the worker's two messages, batched (`tasks.broker.dispatch`).
STORE_CEILINGS = {
    # A transaction: checked out (PostgreSQL: a ping first, `store.stalls`), begun,
    # committed, reset as it is checked in.
    "checkout": 10, "transaction": 10, "commit": 10, "reset": 10,
    # The claim, the model call recorded, the finish.
    "statement UPDATE relayq_runs": 8,
    # The claim reads the transcript only when the worker does not hold it (the first).
    "statement SELECT relayq_messages": 1,
    # The assistant's message at each model call; the tool results with the finish.
    "statement INSERT relayq_messages": 5,
    # Each model call's usage; each tool call's record.
    "statement INSERT relayq_ledger": 4,
    # The next turn's message, with the finish; the turn's own, gone with it.
    "statement INSERT relayq_outbox": 2, "statement DELETE relayq_outbox": 3,
    # The sent-marks.
    "statement UPDATE relayq_outbox": 2,
    # The run's end, for the hosts' feed.
    "statement INSERT relayq_events": 1,
}  # fmt: skip
SQLITE_CEILINGS = {
    **STORE_CEILINGS,
    # What SQLite ran: SQLAlchemy's statements, and its BEGIN (IMMEDIATE) and COMMIT.
    **{k.replace("statement", "sqlite"): n for k, n in STORE_CEILINGS.items() if "statement" in k},
    "statement BEGIN": 10, "sqlite BEGIN": 10, "sqlite COMMIT": 10,
}  # fmt: skip
REDIS_CEILINGS = {
    # One message a turn: the first sent by the host, the others by the worker.
    "LPUSH relayq.turns": 3,
    # The consumer takes each message with a BRPOP (not counted: it is also how it waits)
    # and nothing else: a turn message is held in the worker's memory only, never noted
    # in kombu's `unacked` (`workers.doorbell`).
    # The provider's limits: a script to take a slot before a model call, one to give it back.
    "EVALSHA limits:{}:state": 6,
    # The provider's circuit: read at most once a model call (a closed one is trusted for
    # a while, `tasks.broker.redis_circuit.REFRESH`).
    "EVALSHA circuit:{}": 3,
    # The run's end, announced to the hosts waiting on it.
    "PUBLISH runs": 1,
    # What the scripts run inside Redis (no round trips): the limiter's, per call,
    "lua TIME": 9, "lua HMGET limits:{}:state": 3, "lua HSET limits:{}:state": 3,
    "lua PEXPIRE limits:{}:state": 6, "lua PEXPIREAT limits:{}:inflight": 3,
    "lua ZADD limits:{}:inflight": 3, "lua ZCARD limits:{}:inflight": 3,
    "lua ZRANGE limits:{}:inflight": 3, "lua ZREM limits:{}:inflight": 3,
    "lua ZREMRANGEBYSCORE limits:{}:inflight": 3,
    # and the circuit's.
    "lua HMGET circuit:{}": 3,
}  # fmt: skip
MESSAGE_CEILING = 1200
"""Bytes of a turn message as the broker holds it: Celery's envelope and headers around
`[run_id, version]`, base64 in JSON. It carries no transcript, whatever the run's length."""


@dataclass
class Costs:
    store: Counter[str]
    """Each recorded store call's shape, and how many."""
    redis: Counter[str]
    """Each Redis command's shape (its name and key, ids taken out), and how many."""
    message_bytes: list[int]
    """Each turn message's body, as the broker was handed it."""
    brpop_keys: list[int]
    """The lists each of the consumer's BRPOPs named."""


class Monitor:
    """Every command a Redis server runs, from MONITOR, on a thread until closed."""

    def __init__(self, port: int) -> None:
        self._client = redis.Redis(host="127.0.0.1", port=port)
        self._monitor = self._client.monitor()
        self._monitor.__enter__()
        self.commands: list[str] = []
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        try:
            for command in self._monitor.listen():
                # A command a script ran is no round trip of its own: marked as the script's.
                lua = command.get("client_type") == "lua"
                self.commands.append(("lua " if lua else "") + command["command"])
        except (redis.RedisError, OSError, ValueError):
            return  # `close` shut the connection: the listening ends with it

    def close(self) -> None:
        self._monitor.__exit__(None, None, None)
        self._client.close()
        self._thread.join(5)


_PERIODIC = re.compile(r"^(BRPOP|PING|PUBLISH \S*celeryev)")
"""The consumer's one-second polls, health checks, Celery's worker-heartbeat events:
by the second, not by the turn."""
_ID = re.compile(r"\{[0-9a-f]+\}|[0-9a-f]{8}-[0-9a-f-]{27}|run_[0-9a-f]+|[0-9a-f]{40}")


def command_shape(command: str, prefix: str) -> str:
    """`HSET unacked`, `EVALSHA circuit:{}`, `LPUSH relayq.turns`: a command's name and
    first key, the key prefix and ids taken out; `lua ...` for one a script ran."""
    script = command.startswith("lua ")
    words = command.removeprefix("lua ").split(" ", 3)
    name = words[0].upper()
    if name in ("MULTI", "EXEC"):
        return name
    if name == "EVALSHA" and len(words) > 3:
        key = words[3].split(" ", 1)[0]  # EVALSHA sha numkeys key ...
    else:
        key = words[1] if len(words) > 1 else ""
    shape = f"{name} {_ID.sub('{}', key.removeprefix(prefix))}".strip()
    return f"lua {shape}" if script else shape


async def _one_run(client: DurableClient, prompt: str) -> str:
    run_id = await client.start("counted", prompt)
    deadline = time.monotonic() + 60
    while (status := get_run(client.db, run_id).status) in ("queued", "running"):
        assert time.monotonic() < deadline, "the run did not finish"
        await asyncio.sleep(0.05)
    assert status == "done"
    return run_id


def _settled(monitor: Monitor, log: Path) -> None:
    """Until neither the store calls nor the turn-bound commands have grown for a second:
    the run's last writes (its sent-marks, batched) come after the host sees it done, and
    nothing marks the last of them, so a quiet second is the sign."""
    seen = None
    while True:
        now = (len(store_calls(log)), sum(not _PERIODIC.match(c) for c in monitor.commands))
        if now == seen:
            return
        seen = now
        time.sleep(1.0)


@pytest.fixture(scope="module")
def costs(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Costs:
    home = tmp_path_factory.mktemp("turn-cost")
    log = home / "log"
    prefix = "cost:"
    server = ServerProcess(free_port(), "--latency", "0.05", "--turns", str(TURNS)).start()
    try:
        with PrivateRedis(home / "redis") as broker:
            env = {
                **os.environ,
                "RELAYQ_HOME": str(home),
                "RELAYQ_DATABASE_URL": database_url,
                "RELAYQ_BROKER_URL": broker.url,
                "RELAYQ_KEY_PREFIX": prefix,
                "RELAYQ_AGENTS": "tests.durable.cost_agents",
                "RELAYQ_TEST_LOG": str(log),
                SWITCH: "1",
                "RELAYQ_BENCH_MODEL_URL": server.url,
                "RELAYQ_BENCH_KEY": "bench-key",
                "NO_PROXY": "127.0.0.1,localhost",
                # Periodic work out of the window (its cost is counted on its own)
                "RELAYQ_HEARTBEAT_EVERY": "60",
                "RELAYQ_WORKER_TIMEOUT": "300",
                "RELAYQ_SWEEP_EVERY": "3600",
                "RELAYQ_BATCH_POLL": "3600",
            }
            worker = Worker(env, home / "worker.log").start("-c", "10")
            client = DurableClient(settings=Settings.from_env(env))
            try:
                asyncio.run(_one_run(client, "warm up"))
                monitor = Monitor(broker.port)
                try:
                    _settled(monitor, log)
                    start_store, start_redis = len(store_calls(log)), len(monitor.commands)
                    asyncio.run(_one_run(client, "counted"))
                    _settled(monitor, log)
                    calls = store_calls(log)[start_store:]
                    commands = monitor.commands[start_redis:]
                finally:
                    monitor.close()
            finally:
                client.close()
                worker.stop()
    finally:
        server.kill()
    turn_bound = [c for c in commands if not _PERIODIC.match(c)]
    return Costs(
        store=_unlocked(Counter(calls)),
        redis=Counter(command_shape(c, prefix) for c in turn_bound),
        message_bytes=[len(c.split(" ", 2)[2]) for c in turn_bound if c.startswith("LPUSH ")],
        # BRPOP key ... key timeout
        brpop_keys=[len(c.split()) - 2 for c in commands if c.startswith("BRPOP ")],
    )


_ASKED_AGAIN = ("checkout", "transaction", "statement BEGIN", "sqlite BEGIN", "reset")
"""What a BEGIN that found SQLite's lock held by another process (the host marking its
message sent, say) cost: the writer checks that connection in and asks again."""


def _unlocked(counts: Counter[str]) -> Counter[str]:
    """`counts` without the attempts another process's lock turned back: contention, not
    what the turn costs."""
    refused = counts.pop(LOCKED, 0)
    return counts - Counter(dict.fromkeys(_ASKED_AGAIN, refused))


def _within(counts: Counter[str], ceilings: dict[str, int]) -> list[str]:
    """What went over its ceiling, or has none (a new statement or command), by shape."""
    return [
        f"{shape}: {n} (ceiling {ceilings.get(shape, 0)})"
        for shape, n in sorted(counts.items())
        if n > ceilings.get(shape, 0)
    ]


def test_a_turn_costs_at_most_three_store_transactions_and_their_statements(
    costs: Costs, database_url: str
):
    ceilings = SQLITE_CEILINGS if database_url.startswith("sqlite") else STORE_CEILINGS
    over = _within(costs.store, ceilings)
    # Every shape named in full: pytest's own diff shows the first of a list only.
    assert not over, (
        "; ".join(over)
        + " | all: "
        + ", ".join(f"{shape} {n}" for shape, n in sorted(costs.store.items()))
    )
    # And the run did go through each (the counts are of a real turn's work)
    assert costs.store["statement UPDATE relayq_runs"] >= 6


def test_a_turn_costs_one_message_sent_consumed_and_acknowledged_and_its_limits(costs: Costs):
    assert _within(costs.redis, REDIS_CEILINGS) == [], sorted(costs.redis.items())
    assert costs.redis["LPUSH relayq.turns"] == 3
    assert costs.redis["EVALSHA limits:{}:state"] >= 3


def test_a_turn_message_carries_no_transcript(costs: Costs):
    assert len(costs.message_bytes) == 3
    assert max(costs.message_bytes) <= MESSAGE_CEILING, costs.message_bytes


def test_each_brpop_names_only_the_lists_messages_are_sent_to(costs: Costs):
    # The worker's three queues, each at the three priorities messages go at (0; a batch's
    # 6 and 9), not at kombu's four steps: every list named costs each message's BRPOP.
    assert costs.brpop_keys, "the consumer took its messages with BRPOP"
    assert set(costs.brpop_keys) == {3 * 3}, costs.brpop_keys


def test_a_heartbeat_costs_one_transaction_of_one_statement(database_url: str):
    # Periodic, not per turn: one beat every RELAYQ_HEARTBEAT_EVERY (2 s) per process is,
    # at a hundred turns a second, a fiftieth of a statement a turn
    db = Database(database_url)
    try:
        migrate(db)
        beat(db, "cost-w1", hostname="h", pid=1)  # the first beat registers the worker
        seen: list[str] = []

        def record(_conn: object, _cursor: object, statement: str, *_: object) -> None:
            seen.append(shape(statement))

        for engine in db.engines:
            event.listen(engine, "before_cursor_execute", record)
        beat(db, "cost-w1", hostname="h", pid=1)
        assert [s for s in seen if s not in ("BEGIN", "PRAGMA")] == ["UPDATE relayq_workers"]
    finally:
        db.dispose()


def test_a_begin_another_process_turned_back_is_no_transaction_of_the_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # The host marking its message sent as the worker claims the run: the worker's BEGIN
    # finds SQLite's lock taken and asks again. Recorded, and taken out of the counts.
    monkeypatch.setenv("RELAYQ_TEST_LOG", str(tmp_path / "log"))
    monkeypatch.setenv(SWITCH, "1")
    path = tmp_path / "relayq.db"
    db = Database(f"sqlite:///{path}")
    other = sqlite3.connect(path, isolation_level=None)
    try:
        migrate(db)
        with db.transaction() as conn:  # the writers' connection made, outside the count
            conn.exec_driver_sql("SELECT 1")
        before = len(store_calls(tmp_path / "log"))
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreBusy), impatient(), db.transaction() as conn:
            conn.exec_driver_sql("SELECT 1")
        other.execute("COMMIT")
        with db.transaction() as conn:
            conn.exec_driver_sql("UPDATE relayq_runs SET suspect = suspect")
        calls = Counter(store_calls(tmp_path / "log")[before:])
        assert calls[LOCKED] == 1, calls
        assert _unlocked(calls) == Counter(
            {
                "checkout": 1, "transaction": 1, "statement BEGIN": 1, "sqlite BEGIN": 1,
                "statement UPDATE relayq_runs": 1, "sqlite UPDATE relayq_runs": 1,
                "commit": 1, "sqlite COMMIT": 1, "reset": 1,
            }
        )  # fmt: skip
    finally:
        other.close()
        db.dispose()

"""Dispatching a change's messages: rows sent from the loop go to the sending thread in
batches (whatever is dispatched while a batch is going out goes with the next, in one
hand-off; each caller learns what of its own went), what went is marked sent in one write
for many, and what did not is handed back."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ParamSpec, TypeVar

import pytest
from celery import Celery

from relayq import new_id
from store import Database, OutboxRow, RunSpec, create_run, migrate
from store.outbox import sent_at, task_id_of
from tasks.broker.dispatch import MARK_AFTER, BrokerDispatch, Outgoing
from tasks.broker.publish import sender_app
from tasks.settings import Settings
from tasks.storeio import StoreCalls, StoreDoor
from tests.brokers import PrivateRedis
from tests.ports import free_port

P = ParamSpec("P")
T = TypeVar("T")


def row(n: int) -> OutboxRow:
    return OutboxRow(id=n, task="t", queue="q", args=[n], label=f"row {n}")


class Sender:
    """Sends every row but those named in `refuse`; the first batch waits for `release`."""

    def __init__(self, refuse: frozenset[int] = frozenset()) -> None:
        self.batches: list[list[int]] = []
        self.refuse = refuse
        self.release = threading.Event()
        self.holding = threading.Event()
        """Set once the first batch is in the sender's hands."""
        self.threads: set[str] = set()

    def __call__(self, rows: list[OutboxRow]) -> list[OutboxRow]:
        self.threads.add(threading.current_thread().name)
        self.batches.append([r.id or 0 for r in rows])
        if len(self.batches) == 1:
            self.holding.set()
            self.release.wait(5)
        if any(r.id == 99 for r in rows):
            raise RuntimeError("the broker fell over")
        return [r for r in rows if r.id not in self.refuse]


async def test_what_is_published_while_a_batch_goes_out_goes_with_the_next_in_one_hand_off():
    sender = Sender(refuse=frozenset({4}))
    with ThreadPoolExecutor(1, thread_name_prefix="send") as pool:
        outgoing = Outgoing(sender, pool)
        first = asyncio.create_task(outgoing([row(1)]))
        assert await asyncio.to_thread(sender.holding.wait, 5), "the first batch never went"
        later = [asyncio.create_task(outgoing([row(n), row(n + 1)])) for n in (2, 4)]
        await asyncio.sleep(0)  # each later caller runs up to its wait, behind the first batch
        sender.release.set()
        went = await asyncio.gather(first, *later)

    assert sender.batches == [[1], [2, 3, 4, 5]]
    assert [[r.id for r in rows] for rows in went] == [[1], [2, 3], [5]]
    assert sender.threads == {"send_0"}


async def test_a_batch_that_fails_fails_its_callers_and_the_next_still_goes():
    sender = Sender()
    sender.release.set()
    with ThreadPoolExecutor(1) as pool:
        outgoing = Outgoing(sender, pool)
        with pytest.raises(RuntimeError, match="fell over"):
            await outgoing([row(99)])
        assert [r.id for r in await outgoing([row(7)])] == [7]


# -- BrokerDispatch: a real Redis broker, a SQLite store -----------------------------------


class Store:
    """A store of the test's own, whose calls from the loop are counted by function."""

    def __init__(self, folder: Path) -> None:
        self.db = Database(f"sqlite:///{folder / 'store.db'}")
        migrate(self.db)
        self.calls: list[str] = []

        calls = self.calls

        class Counted(StoreCalls):
            async def __call__(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
                calls.append(getattr(fn, "__name__", ""))
                return fn(*args, **kwargs)

        self.door = StoreDoor(self.db, Counted(inline=True, executor=lambda: None))

    def new_runs(self, count: int) -> list[OutboxRow]:
        return [
            create_run(self.db, RunSpec("a"), run_id=new_id("run"), prompt="p")
            for _ in range(count)
        ]

    def marked(self, rows: list[OutboxRow]) -> list[bool]:
        return [sent_at(self.db, task_id_of(r)) is not None for r in rows]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    made = Store(tmp_path)
    yield made
    made.db.dispose()


def sender(broker_url: str, prefix: str, home: Path) -> Celery:
    env = {"RELAYQ_HOME": str(home), "RELAYQ_BROKER_URL": broker_url, "RELAYQ_KEY_PREFIX": prefix}
    return sender_app(Settings.from_env(env))


async def test_what_is_sent_together_is_marked_in_one_write_after_the_pause_and_close_owes_none(
    store: Store, private_redis: PrivateRedis, prefix: str, tmp_path: Path
):
    # Given a dispatch to a running broker
    app = sender(private_redis.url, prefix, tmp_path)
    dispatch = BrokerDispatch(lambda: app, store.door)
    first, more, last = store.new_runs(1), store.new_runs(2), store.new_runs(1)

    # When two callers dispatch at once
    went = await asyncio.gather(dispatch(first), dispatch(more))

    # Then every message is on its queue, none marked yet: the marks wait for company
    assert went == [1, 2]
    assert private_redis.client().llen(f"{prefix}relayq.turns") == 3
    assert store.marked(first + more) == [False] * 3
    # ... and after the pause, all three are marked in one write
    for _ in range(100):
        if all(store.marked(first + more)):
            break
        await asyncio.sleep(MARK_AFTER / 4)
    assert store.marked(first + more) == [True] * 3
    assert store.calls == ["mark_published"]

    # And a message sent just before close is marked by the close itself
    assert await dispatch(last) == 1
    dispatch.close()
    assert store.marked(last) == [True]
    assert store.calls == ["mark_published"]
    app.close()


async def test_what_the_broker_does_not_take_is_handed_to_on_unsent_and_left_unmarked(
    store: Store, prefix: str, tmp_path: Path
):
    # Given a dispatch to a broker that does not answer, told what to do with the unsent
    app = sender(f"redis://127.0.0.1:{free_port()}/0", prefix, tmp_path)
    unsent: list[list[OutboxRow]] = []
    dispatch = BrokerDispatch(lambda: app, store.door, on_unsent=unsent.append)
    rows = store.new_runs(2)

    # When it dispatches two messages
    went = await dispatch(rows)

    # Then neither went, both were handed over, and neither is marked: a sweep sends them
    dispatch.close()
    assert went == 0
    assert [[r.id for r in batch] for batch in unsent] == [[r.id for r in rows]]
    assert store.marked(rows) == [False, False]
    assert store.calls == []
    app.close()

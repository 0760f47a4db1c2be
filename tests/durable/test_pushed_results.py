"""Results pushed to waiting hosts: workers announce the runs they settle, hosts wake on it.

The host-side tests use a client on a key prefix no worker consumes and a store
no worker sweeps (`Host`): its runs change only when the test changes them, the
way another process would change them, with no announcement, unless the test
publishes one. Their waiters poll as a fallback every hour (`recheck_every`), so
a waiter that wakes at all was woken by what the test did.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pytest
import redis
import redis.asyncio
from sqlmodel import col, select

from relayq import Budget, RunResult
from relayq.approvals import decline
from store import Database, OutboxRow, cancel_run
from tasks import DurableClient, Settings, WaitTimeout
from tasks.broker.announce import channel_of
from tasks.broker.redis_clients import close_redis
from tasks.client.client import Waiting
from tests.brokers import PrivateRedis
from tests.store.driver import statements

from .conftest import Broker, Durable, Eventually, SpareWorkers

NEVER = timedelta(hours=1)
"""A fallback poll that never comes within a test."""


def _status_reads(seen: list[str]) -> int:
    """The waiter's reads of many runs' status (`store.settled_many`) among `seen`."""
    return sum(1 for q in seen if "CASE WHEN" in q and "FROM relayq_runs" in q)


@dataclass
class Host:
    """Clients on a key prefix no worker consumes, over a store no worker sweeps."""

    settings: Settings
    store: Database
    """Another handle on the store, as another process would change it."""
    broker: redis.Redis
    clients: list[DurableClient] = field(default_factory=list)

    def client(self, *, recheck: timedelta = NEVER, waiting: Waiting = "pushed") -> DurableClient:
        made = DurableClient(settings=self.settings, recheck_every=recheck, waiting=waiting)
        self.clients.append(made)
        return made

    @property
    def channel(self) -> str:
        return channel_of(self.settings)

    def announce(self, *run_ids: str, channel: str | None = None) -> None:
        self.broker.publish(channel or self.channel, " ".join(run_ids))

    def cancel_quietly(self, *run_ids: str) -> None:
        """Settle runs in the store with no announcement (as a lost one would leave them)."""
        for run_id in run_ids:
            assert cancel_run(self.store, run_id) == "cancelled"


@contextmanager
def _host(env: dict[str, str]) -> Iterator[Host]:
    settings = Settings.from_env(env)
    DurableClient(settings=settings).open().close()  # migrates the store
    store = Database(settings.database_url)
    conn = redis.Redis.from_url(settings.broker_url.replace("redis+socket://", "unix://"))
    host = Host(settings, store, conn)
    try:
        yield host
    finally:
        for client in host.clients:
            client.close()
        conn.close()
        store.dispose()


@pytest.fixture
def host(broker: Broker, private_database: str, tmp_path: Path) -> Iterator[Host]:
    env = {
        "RELAYQ_HOME": str(tmp_path),
        "RELAYQ_DATABASE_URL": private_database,
        "RELAYQ_BROKER_URL": broker.url,
        "RELAYQ_KEY_PREFIX": broker.new_prefix(),
    }
    with _host(env) as made:
        yield made


async def _subscribed(client: DurableClient, eventually: Eventually) -> None:
    """Until the client hears announcements (its waiter, made here as a first wait would)."""
    waiter = client._waiter_here()
    await eventually(lambda: waiter.subscription is not None, what="the client to subscribe")


def _waiting(client: DurableClient, *run_ids: str) -> asyncio.Task[list[RunResult]]:
    async def wait_all() -> list[RunResult]:
        return list(await asyncio.gather(*(client.result(r, wait=True) for r in run_ids)))

    return asyncio.create_task(wait_all())


async def _waiting_read(
    client: DurableClient, eventually: Eventually, *run_ids: str
) -> asyncio.Task[list[RunResult]]:
    """Waiters on `run_ids`, once they have read the runs' status a first time."""
    with statements(client.db) as seen:
        waiting = _waiting(client, *run_ids)
        await eventually(lambda: _status_reads(seen) >= 1, what="the first read")
    return waiting


async def _woken(task: asyncio.Task[list[RunResult]], what: str) -> list[RunResult]:
    # Bounded only so a test that breaks says so: nothing else would wake the waiter.
    try:
        return await asyncio.wait_for(task, 30)
    except TimeoutError:
        pytest.fail(f"the waiters were not woken by {what}")


# -- a worker announces; the host wakes on it --------------------------------------------------


async def test_a_waiter_wakes_on_the_workers_announcement(
    durable: Durable, eventually: Eventually, prompt: str
):
    # Given a subscribed client that polls as a fallback only every hour, waiting on a run
    # whose tool holds its turn on the worker
    async with DurableClient(settings=durable.settings, recheck_every=NEVER) as client:
        await _subscribed(client, eventually)
        run_id = await client.start("holding", prompt)
        await eventually(lambda: durable.count("tool", f"hold {run_id}") == 1, what="the tool")
        with statements(client.db) as seen:
            waiting = _waiting(client, run_id)
            await eventually(lambda: _status_reads(seen) == 1, what="the first read")

            # When the tool lets the run finish
            (durable.log / f"release-{run_id}").touch()

            # Then the worker's announcement wakes the waiter
            (res,) = await _woken(waiting, "the worker's announcement")
        assert res.status == "done"
        assert res.text == "released"


async def test_a_run_started_while_subscribed_is_read_once_when_it_settles(
    durable: Durable, eventually: Eventually, prompt: str
):
    # Given a subscribed client
    async with DurableClient(settings=durable.settings, recheck_every=NEVER) as client:
        await _subscribed(client, eventually)

        # When it runs two turns
        with statements(client.db) as seen:
            res = await client.run("two-step", prompt, timeout=30)

    # Then it read the run's status once: when its last turn was announced (the first
    # turn, which queued the second, was not; a run changed while subscribed needs no
    # read before its announcement)
    assert res.status == "done"
    assert _status_reads(seen) == 1, durable.worker.logfile.read_text()[-4000:]


async def test_an_announcement_names_the_run_only_on_the_prefixed_channel(
    durable: Durable, eventually: Eventually, prompt: str
):
    # Given a listener on every channel of the broker
    listener = redis.asyncio.Redis.from_url(
        durable.broker.url.replace("redis+socket://", "unix://")
    )
    pubsub = listener.pubsub()
    try:
        await pubsub.psubscribe("*")
        # When a run of two turns ends, and then another
        async with DurableClient(settings=durable.settings) as client:
            first = await client.run("two-step", prompt, timeout=30)
            second = await client.run("two-step", f"{prompt} again", timeout=30)
        assert first.run_id is not None
        assert second.run_id is not None

        # Then, by the time the second is announced, the first was announced once, on the
        # channel named with the worker's key prefix, by its id and nothing else
        heard: list[tuple[str, bytes]] = []
        deadline = time.monotonic() + 30
        while not any(second.run_id.encode() in data for _, data in heard):
            assert time.monotonic() < deadline, f"the second run was not announced: {heard}"
            message = await pubsub.get_message(timeout=1)
            if message is not None and message["type"] == "pmessage":
                heard.append((message["channel"].decode(), message["data"]))
        mine = [(channel, data) for channel, data in heard if first.run_id.encode() in data]
        assert mine == [(f"{durable.settings.key_prefix}runs", first.run_id.encode())]
        assert prompt.encode() not in b"".join(data for _, data in heard)
    finally:
        await close_redis(listener, pubsub)


async def test_a_declined_budget_ends_the_run_and_its_answer_task_announces_it(
    spare_workers: SpareWorkers, eventually: Eventually, prompt: str
):
    # Given a run halted on its budget (its second call would pass it), on a worker that
    # serves the spending agent, and a subscribed client that polls only every hour
    spare = spare_workers.start(RELAYQ_AGENTS="tests.durable.agents,tests.durable.pushed_agents")
    async with DurableClient(settings=spare.settings, recheck_every=NEVER) as client:
        await _subscribed(client, eventually)
        halted = await client.run("spending", prompt, budget=Budget(tokens=1500), timeout=30)
        assert halted.status == "pending", halted.error
        assert halted.pending is not None

        # When the budget request is declined: the answer task ends the run itself
        ended = await asyncio.wait_for(
            client.run_with_answer(halted.pending, decline(halted.pending.id, "no more")), 30
        )

    # Then the answer task's announcement woke the waiter
    assert ended.status == "over_budget"


# -- the host's waiter -------------------------------------------------------------------------


async def test_many_waiters_are_read_in_one_statement_per_wake(host: Host, eventually: Eventually):
    # Given a subscribed client waiting on twenty runs
    client = host.client()
    run_ids = await client.start_many("two-step", [f"many {i}" for i in range(20)])
    await _subscribed(client, eventually)
    with statements(client.db) as seen:
        waiting = _waiting(client, *run_ids)
        await eventually(lambda: _status_reads(seen) == 1, what="the first read")

        # When they all settle and one announcement names them all
        host.cancel_quietly(*run_ids)
        host.announce(*run_ids)
        results = await _woken(waiting, "the announcement")

    # Then every waiter woke after one more read of them all
    assert [r.status for r in results] == ["cancelled"] * 20
    assert _status_reads(seen) == 2


async def test_announcements_on_another_prefixs_channel_wake_no_one(
    host: Host, eventually: Eventually
):
    # Given a subscribed client waiting on a run, and on a second one
    client = host.client()
    quiet, marker = await client.start_many("two-step", ["quiet", "marker"])
    await _subscribed(client, eventually)
    waiting_quiet = await _waiting_read(client, eventually, quiet)
    waiting_marker = await _waiting_read(client, eventually, marker)

    # When both settle, the first is announced without the key prefix and on another
    # deployment's channel, and then the second on the client's own
    host.cancel_quietly(quiet, marker)
    host.announce(quiet, channel="runs")
    host.announce(quiet, channel=f"relayq-other-{uuid.uuid4().hex[:8]}:runs")
    host.announce(marker)
    await _woken(waiting_marker, "the announcement")

    # Then the second's waiter woke and the first's sleeps on (announcements reach a
    # subscriber in the order they were sent)
    assert not waiting_quiet.done()
    waiting_quiet.cancel()


async def test_a_run_announced_before_its_wait_begins_is_read_at_once(
    host: Host, eventually: Eventually
):
    # Given a subscribed client waiting on a marker run, that starts another run, having
    # noted where its hearing stood
    client = host.client()
    (marker,) = await client.start_many("two-step", ["marker"])
    await _subscribed(client, eventually)
    waiting_marker = await _waiting_read(client, eventually, marker)
    since = client._waits.listening()
    (run_id,) = await client.start_many("two-step", ["quick"])

    # When the run settles and its announcement is heard before the client waits on it
    # (the marker's, sent after it, woke the marker's waiter)
    host.cancel_quietly(run_id, marker)
    host.announce(run_id)
    host.announce(marker)
    await _woken(waiting_marker, "the marker's announcement")

    # Then the wait reads the run at once, as the announcement it missed asked
    with statements(client.db) as seen:
        waiting = asyncio.create_task(client._waits.until_settled(run_id, None, since))
        try:
            await asyncio.wait_for(waiting, 30)
        except TimeoutError:
            pytest.fail("a wait begun after its run's announcement was never woken")
    assert _status_reads(seen) == 1


async def test_a_run_settled_unannounced_is_found_by_the_fallback_poll(
    host: Host, eventually: Eventually
):
    # Given a client whose fallback poll reads the runs it waits on every 0.2 s
    client = host.client(recheck=timedelta(seconds=0.2))
    run_ids = await client.start_many("two-step", ["lost 1", "lost 2"])
    await _subscribed(client, eventually)
    waiting = await _waiting_read(client, eventually, *run_ids)

    # When the runs settle and nobody announces it
    host.cancel_quietly(*run_ids)

    # Then the fallback poll wakes their waiters
    results = await _woken(waiting, "the fallback poll")
    assert [r.status for r in results] == ["cancelled", "cancelled"]


async def test_a_cancel_made_by_the_client_wakes_its_own_waiter(host: Host, eventually: Eventually):
    client = host.client()
    run_id = await client.start("two-step", "to cancel")
    await _subscribed(client, eventually)
    waiting = await _waiting_read(client, eventually, run_id)

    assert await client.cancel(run_id) == "cancelled"

    (res,) = await _woken(waiting, "its own cancel")
    assert res.status == "cancelled"


async def test_a_wait_that_times_out_reads_the_run_once_more_before_giving_up(
    host: Host, eventually: Eventually
):
    client = host.client()
    stays, settles = await client.start_many("two-step", ["stays queued", "settles"])

    with pytest.raises(WaitTimeout) as raised:
        await client.result(stays, wait=True, timeout=0.2)
    assert (raised.value.run_id, raised.value.status) == (stays, "queued")

    # A run settled (unannounced) after its waiter's first read is returned at the deadline.
    with statements(client.db) as seen:
        waiting = asyncio.create_task(client.result(settles, wait=True, timeout=1.0))
        await eventually(lambda: _status_reads(seen) >= 1, what="the first read")
    host.cancel_quietly(settles)
    assert (await waiting).status == "cancelled"


async def test_polling_waits_as_before(host: Host, eventually: Eventually):
    client = host.client(waiting="polled")
    run_id = await client.start("two-step", "polled")
    with statements(client.db) as seen:
        waiting = _waiting(client, run_id)
        await eventually(lambda: any("FROM relayq_runs" in q for q in seen), what="a poll")
    host.cancel_quietly(run_id)
    (res,) = await _woken(waiting, "its poll")
    assert res.status == "cancelled"


# -- a broker that goes away -------------------------------------------------------------------


Outage = tuple[PrivateRedis, Host, DurableClient, list[str]]


@pytest.fixture
def private_broker(tmp_path: Path) -> Iterator[tuple[PrivateRedis, Host]]:
    server = PrivateRedis(tmp_path / "redis").start()
    env = {
        "RELAYQ_HOME": str(tmp_path),
        "RELAYQ_DATABASE_URL": f"sqlite:///{tmp_path / 'relayq.db'}",
        "RELAYQ_BROKER_URL": server.url,
        "RELAYQ_KEY_PREFIX": "relayq-pushed:",
    }
    try:
        with _host(env) as made:
            yield server, made
    finally:
        server.stop()


@pytest.fixture
async def outage(private_broker: tuple[PrivateRedis, Host], eventually: Eventually) -> Outage:
    """A subscribed client on a private Redis, and three runs for it to wait on."""
    server, host = private_broker
    client = host.client()
    run_ids = await client.start_many("two-step", ["a", "b", "c"])
    await _subscribed(client, eventually)
    return server, host, client, run_ids


async def test_a_broker_restarted_empty_strands_no_waiter(outage: Outage, eventually: Eventually):
    server, host, client, run_ids = outage
    waiting = await _waiting_read(client, eventually, *run_ids)
    waiter = client._waiter_here()

    # When the broker dies, the runs settle meanwhile (their announcements lost with it),
    # and it comes back empty
    server.kill()
    await eventually(lambda: waiter.subscription is None, what="the client to notice")
    host.cancel_quietly(*run_ids)
    server.restart_empty()

    # Then the client subscribes again and reads every run it waits on
    results = await _woken(waiting, "subscribing again")
    assert [r.status for r in results] == ["cancelled"] * 3


async def test_a_dropped_subscriber_strands_no_waiter(outage: Outage, eventually: Eventually):
    server, host, client, run_ids = outage
    waiting = await _waiting_read(client, eventually, *run_ids)

    # When the runs settle unannounced as the broker drops the client's subscription
    host.cancel_quietly(*run_ids)
    with server.client() as admin:
        assert admin.client_kill_filter(_type="pubsub") >= 1

    # Then the client subscribes again and reads every run it waits on
    results = await _woken(waiting, "subscribing again")
    assert [r.status for r in results] == ["cancelled"] * 3


def test_a_client_waits_on_each_event_loop_it_is_used_on(host: Host):
    # A script may run each call in an event loop of its own (`asyncio.run`).
    client = host.client()
    for n in range(3):
        run_id = asyncio.run(client.start("two-step", f"loop {n}"))
        host.cancel_quietly(run_id)
        res = asyncio.run(client.result(run_id, wait=True, timeout=10))
        assert res.status == "cancelled"


async def test_what_a_client_sent_is_marked_sent_by_the_time_it_closes(host: Host):
    client = host.client()
    run_ids = await client.start_many("two-step", ["mark 1", "mark 2"])
    client.close()
    with host.store.read() as s:
        rows = s.exec(select(OutboxRow).where(col(OutboxRow.run_id).in_(run_ids))).all()
    assert len(rows) == 2
    assert all(row.published_at is not None for row in rows)

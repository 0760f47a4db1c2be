"""Batch queues on real workers: each batch's turns wait in a queue of their own, behind every
interactive turn, and the batches take turns; `RELAYQ_WORKER_BATCHES` makes workers for
interactive runs or for batches only.

Each test has a database no other worker sweeps (`private_database`) and a key prefix
of its own. The `paced` agent (`tests.durable.batch_agents`) logs each model call as it
starts, with the worker it ran on: the tests assert on the order turns were taken in,
with wide margins, never on how long they took.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from relayq.relay import RelayResult, relay_answer, relay_calls_of
from store import BatchRow, Database, batch_results, batch_status
from store.batch_queues import batch_queue_name
from tasks import DurableClient, Settings
from tasks.broker.peek import priority_lists
from tasks.broker.publish import BATCH_PRIORITY
from tasks.observability.gauges import BrokerView, StoreGauges
from tasks.settings import PRIORITY_STEPS
from tests.brokers import PrivateRedis
from tests.conftest import Parts
from tests.durable.batch_agents import STEPS

from .conftest import (
    PG_ADMIN,
    SQLITE_ONLY,
    Broker,
    Durable,
    Eventually,
    SpareWorkers,
    Worker,
    _postgres_url,
    unique_name,
)
from .sent_messages import sent_messages
from .test_cli_guidance import AGENTS as GUIDANCE_AGENTS
from .test_cli_guidance import error_line, relayq

pytestmark = pytest.mark.timeout(120)  # each test starts a worker or two of its own

# The subject is the broker's queues, SQLite's store alone (SQLITE_ONLY): what the store
# does for batches is proven on both stores by tests/store/test_batch_queues.py.

AGENTS = "tests.durable.agents,tests.durable.batch_agents"
TURNS = "relayq.turns"


@dataclass
class Place:
    """A private store and a key prefix of its own, its workers and a client on them."""

    env: dict[str, str]
    spares: SpareWorkers
    log: Path
    clients: list[DurableClient] = field(default_factory=list)

    def worker(self, *args: str, **env: str) -> Durable:
        """A worker on this place, `env` over its environment, `args` for `celery worker`."""
        return self.spares._launch({**self.env, **env}, args)

    def client(self) -> DurableClient:
        made = DurableClient(settings=Settings.from_env(self.env))
        self.clients.append(made)
        return made

    def db(self) -> Database:
        return Database(self.env["RELAYQ_DATABASE_URL"])

    def calls(self, tag: str) -> list[tuple[str, str]]:
        """(prompt, worker) of each `paced` call on a prompt of this test, in the order
        the worker took them."""
        path = self.log / "paced.log"
        lines = path.read_text().splitlines() if path.exists() else []
        return [(p, w) for p, _, w in (line.partition("\t") for line in lines) if tag in p]


@pytest.fixture
async def place(
    durable: Durable, spare_workers: SpareWorkers, private_database: str
) -> AsyncIterator[Place]:
    env = {
        **durable.env,
        "RELAYQ_DATABASE_URL": private_database,
        "RELAYQ_KEY_PREFIX": durable.broker.new_prefix(),
        "RELAYQ_AGENTS": AGENTS,
        "RELAYQ_BATCH_POLL": "0.2",
    }
    made = Place(env, spare_workers, durable.log)
    yield made
    for client in made.clients:
        client.close()


@pytest.fixture
def tag() -> str:
    return uuid.uuid4().hex[:12]


def jobs(tag: str, name: str, n: int) -> list[tuple[str, str]]:
    return [(f"{name}{i}", f"{tag} {name} {i}") for i in range(n)]


async def finished(client: DurableClient, batch_id: str) -> int:
    status = await asyncio.to_thread(batch_status, client.db, batch_id)
    return status.finished


def done_within(client: DurableClient, batch_id: str, total: int) -> Callable[[], object]:
    async def check() -> bool:
        return await finished(client, batch_id) == total

    return check


# --- every turn of a batch goes to its queue -----------------------------------------------


@SQLITE_ONLY
async def test_every_turn_of_a_batch_goes_to_its_queue_after_an_answer_and_on_a_rerun(
    place: Place, tag: str, eventually: Eventually
):
    # Given a worker, and a batch of an agent whose runs ask the host for an answer
    place.worker()
    client = place.client()
    first = await client.start_batch("lookup", jobs(tag, "j", 2))
    queue = batch_queue_name(TURNS, first.batch_id)

    # When both halt on their request and are answered, and the batch is run again with a
    # job more
    for run_id in first.runs.values():
        halted = await client.result(run_id, wait=True, timeout=30)
        assert halted.pending is not None, halted.error
        [call] = relay_calls_of(halted.pending)
        answer = relay_answer(halted.pending.id, [RelayResult(id=call.id, output="found")])
        assert (await client.run_with_answer(halted.pending, answer, timeout=30)).status == "done"
    again = await client.start_batch("lookup", jobs(tag, "j", 3), batch_id=first.batch_id)
    assert again.started == ["j2"]
    assert (await client.result(again.runs["j2"], wait=True, timeout=30)).status == "pending"

    # Then the batch keeps its queue, and every turn of every run of it went there
    db = place.db()
    try:
        with db.read() as s:
            batch = s.get(BatchRow, first.batch_id)
            runs = {r.id for r in batch_results(db, first.batch_id)}
    finally:
        db.dispose()
    assert batch is not None
    assert batch.queue == queue
    turns = sent_messages(place.log, run_ids=runs)
    assert len(turns) == 5, "two turns of each answered run, the rerun's first"
    assert {t.queue for t in turns} == {queue}


@SQLITE_ONLY
async def test_a_finished_batch_leaves_no_key_on_the_broker(
    place: Place, tag: str, eventually: Eventually
):
    # Given a worker, and a batch of three runs
    place.worker()
    client = place.client()
    started = await client.start_batch("stepping", jobs(tag, "k", 3))
    queue = batch_queue_name(TURNS, started.batch_id).encode()
    broker = redis.Redis.from_url(
        place.env["RELAYQ_BROKER_URL"].replace("redis+socket://", "unix://")
    )
    prefix = place.env["RELAYQ_KEY_PREFIX"]

    def left() -> list[bytes]:
        return [k for k in broker.scan_iter(match=f"{prefix}*", count=1000) if queue in k]

    await eventually(left, what="the batch's queue on the broker")

    # When the batch finishes, and the worker stops consuming its queue
    await eventually(done_within(client, started.batch_id, 3), timeout=60, what="the batch done")

    # Then no key on the broker names its queue: not the queue, nor its exchange's
    # bindings (kombu's Redis transport kept two a batch for good)
    await eventually(lambda: not left(), what="the batch's keys gone")
    broker.close()


@SQLITE_ONLY
async def test_a_batch_started_with_no_worker_waits_at_low_priority_until_one_starts(
    place: Place, tag: str, eventually: Eventually
):
    # Given a batch started while no worker runs
    client = place.client()
    started_batch = await client.start_batch("paced", jobs(tag, "j", 4))
    queue = batch_queue_name(TURNS, started_batch.batch_id)

    # Then its turns wait in its queue, at the lowest priority, and nothing runs them
    conn = redis_of(place)
    prefix = place.env["RELAYQ_KEY_PREFIX"]
    lengths = [conn.llen(prefix + key) for key in priority_lists(queue)]
    conn.close()
    assert dict(zip(PRIORITY_STEPS, lengths, strict=True)) == {0: 0, 6: 0, 9: 4}
    assert await finished(client, started_batch.batch_id) == 0
    # ... and the metrics show its backlog as a queue of its own
    assert depths(place)[queue] == 4

    # When a worker starts, it finds the batch and runs it to its end
    place.worker()
    await eventually(
        done_within(client, started_batch.batch_id, 4), timeout=30, what="the batch to finish"
    )


@SQLITE_ONLY
async def test_a_worker_takes_a_new_batch_at_once_not_at_its_next_look_at_the_store(
    place: Place, tag: str, eventually: Eventually
):
    # Given a worker that looks at the store for active batches only once a minute, and
    # has had its first look: it found a batch started before it, and ran it
    client = place.client()
    before = await client.start_batch("paced", jobs(tag, "before", 1))
    place.worker(RELAYQ_BATCH_POLL="60")
    await eventually(done_within(client, before.batch_id, 1), timeout=20, what="the first look")

    # When a batch starts
    batch = await client.start_batch("paced", jobs(tag, "j", 2))

    # Then the worker runs it within seconds: the host told every worker it started
    await eventually(done_within(client, batch.batch_id, 2), timeout=20, what="the batch")


@SQLITE_ONLY
async def test_a_retried_batch_turn_goes_back_to_its_queue_at_the_batch_priority(
    place: Place, tag: str, eventually: Eventually
):
    # When a batch runs whose model is rate limited twice for each job (each turn retried
    # by the worker as a retry of its Celery task)
    place.worker()
    client = place.client()
    batch = await client.start_batch("flaky", jobs(tag, "j", 2))
    await eventually(done_within(client, batch.batch_id, 2), timeout=30, what="the batch")

    # Then each try was sent to the batch's queue at its lowest priority, the retries too:
    # a retry keeps the priority its message came with (Celery copies it from the
    # delivery), and a priority is a list of its own in the broker (the test above)
    # (a sender records its message just after the broker took it, and the turn it
    # carries may be done first)
    queue = batch_queue_name(TURNS, batch.batch_id)
    runs = set(batch.runs.values())
    await eventually(
        lambda: len(sent_messages(place.log, run_ids=runs)) >= 6, timeout=10, what="six sends"
    )
    tries = sent_messages(place.log, run_ids=runs)
    assert [(t.queue, t.priority) for t in tries] == [(queue, BATCH_PRIORITY)] * 6, tries
    assert sum(t.countdown for t in tries) == 4, "two first tries, four retries"


# --- interactive runs first; batches take turns --------------------------------------------


@SQLITE_ONLY
async def test_interactive_runs_go_before_a_batch_queued_ahead_of_them(
    place: Place, tag: str, eventually: Eventually
):
    # Given a worker taking two turns at a time, busy with a large batch
    place.worker(RELAYQ_CONCURRENCY="2")
    client = place.client()
    batch = await client.start_batch("paced", jobs(tag, "batch", 40))
    await eventually(lambda: place.calls(f"{tag} batch"), what="the batch to start")

    # When six interactive runs are started behind it
    interactive = await client.start_many("paced", [f"{tag} now {i}" for i in range(6)])
    for run_id in interactive:
        assert (await client.result(run_id, wait=True, timeout=60)).status == "done"

    # Then the worker took all six before any batch turn that was not running already ...
    order = [prompt.split()[1] for prompt, _ in place.calls(tag)]
    first, last = order.index("now"), len(order) - 1 - order[::-1].index("now")
    assert order[first : last + 1].count("batch") <= 2, order
    # ... so they were done when most of the batch had not started (in order: all 40 first)
    assert order[:last].count("batch") < 20, order
    await eventually(done_within(client, batch.batch_id, 40), timeout=60, what="the batch")


@SQLITE_ONLY
async def test_a_small_batch_started_after_a_large_one_is_not_left_to_the_end(
    place: Place, tag: str, eventually: Eventually
):
    # Given a worker taking two turns at a time, busy with a large batch A
    place.worker(RELAYQ_CONCURRENCY="2")
    client = place.client()
    large = await client.start_batch("paced", jobs(tag, "large", 40))
    await eventually(lambda: place.calls(f"{tag} large"), what="batch A to start")

    # When a small batch B is started after it
    small = await client.start_batch("paced", jobs(tag, "small", 4))
    await eventually(done_within(client, small.batch_id, 4), timeout=60, what="batch B")

    # Then B finished while most of A had not started: the two queues took turns
    order = [prompt.split()[1] for prompt, _ in place.calls(tag)]
    last_of_small = len(order) - 1 - order[::-1].index("small")
    assert order[:last_of_small].count("large") < 20, order
    await eventually(done_within(client, large.batch_id, 40), timeout=60, what="batch A")


@SQLITE_ONLY
async def test_a_batch_finishes_the_runs_it_started_before_it_starts_more(
    place: Place, tag: str, eventually: Eventually
):
    # Given a worker taking one turn at a time
    place.worker(RELAYQ_CONCURRENCY="1")
    client = place.client()

    # When a batch of four runs of three turns each runs on it
    batch = await client.start_batch("stepping", jobs(tag, "j", 4))
    await eventually(done_within(client, batch.batch_id, 4), timeout=60, what="the batch")

    # Then each run's next turn went before the next run's first: the batch went depth
    # first, finishing a run every three turns, not every run at the very end
    order = [prompt.split(maxsplit=1)[1] for prompt, _ in place.calls(tag)]
    expected = [f"j {job} t{turn}" for job in range(4) for turn in range(STEPS)]
    assert order == expected


# --- workers for interactive runs only, or batches only ------------------------------------


@SQLITE_ONLY
async def test_a_skip_worker_never_takes_batch_turns_and_an_only_worker_only_those(
    place: Place, tag: str, eventually: Eventually
):
    # Given an interactive-only worker and a batch-only one (prefork), on one broker
    place.worker(RELAYQ_WORKER_BATCHES="skip", RELAYQ_TEST_WORKER="skip")
    place.worker(RELAYQ_WORKER_BATCHES="only", RELAYQ_TEST_WORKER="only", RELAYQ_POOL="prefork")
    client = place.client()

    # When a batch and interactive runs are started
    batch = await client.start_batch("paced", jobs(tag, "batch", 6))
    interactive = await client.start_many("paced", [f"{tag} now {i}" for i in range(4)])

    # Then each worker took its own kind only
    for run_id in interactive:
        assert (await client.result(run_id, wait=True, timeout=30)).status == "done"
    await eventually(done_within(client, batch.batch_id, 6), timeout=30, what="the batch")
    ran = {(prompt.split()[1], worker) for prompt, worker in place.calls(tag)}
    assert ran == {("batch", "only"), ("now", "skip")}


@SQLITE_ONLY
async def test_interactive_runs_wait_while_the_only_worker_takes_batches_only(
    place: Place, tag: str, eventually: Eventually
):
    place.worker(RELAYQ_WORKER_BATCHES="only")
    client = place.client()
    batch = await client.start_batch("paced", jobs(tag, "batch", 2))
    run_id = await client.start("paced", f"{tag} now")

    await eventually(done_within(client, batch.batch_id, 2), timeout=30, what="the batch")
    assert (await client.result(run_id)).status == "queued"


# --- a broker outage: the batch queue is consumed again, its lost turns sent again ---------


@SQLITE_ONLY
async def test_a_batch_goes_on_after_the_broker_restarts_empty(
    place: Place, tag: str, eventually: Eventually, tmp_path: Path
):
    # Given a worker on a broker of its own, busy with a batch
    broker = PrivateRedis(tmp_path / "redis").start()
    try:
        place.env.update(
            RELAYQ_BROKER_URL=broker.url,
            RELAYQ_SWEEP_EVERY="1",
            RELAYQ_REDELIVER_AFTER="2",
            RELAYQ_OUTBOX_GRACE="1",
        )
        worker = place.worker(RELAYQ_CONCURRENCY="2")
        client = place.client()
        batch = await client.start_batch("paced", jobs(tag, "batch", 12))
        await eventually(lambda: len(place.calls(tag)) >= 2, what="the batch to start")

        # When the broker dies and comes back with nothing in it a second later (the
        # outage's length is the scenario: a worker with every slot taken reads nothing
        # from the broker, so it has no event to wait for)
        broker.kill()
        await asyncio.sleep(1.0)
        broker.restart_empty()

        # Then the worker consumes the batch's queue again, the sweeper sends its lost
        # turns there again, and the batch finishes
        await eventually(
            done_within(client, batch.batch_id, 12), timeout=90, what="the batch to finish"
        )
        log = worker.worker.logfile.read_text(errors="replace")
        assert log.count("Connected to redis://") >= 2, log[-3000:]
        worker.worker.stop()
    finally:
        broker.stop()


# --- a store that cannot be read: said, and read again at the next poll -------------------


@pytest.mark.postgres
async def test_a_worker_whose_store_cannot_be_read_yet_looks_again_until_it_can(
    broker: Broker, machine_parts: Parts, tmp_path: Path, tag: str, eventually: Eventually
):
    # Given a prefork worker (its pool opens the store only for a turn) on a PostgreSQL
    # database that does not exist yet
    try:
        psycopg.connect(PG_ADMIN, connect_timeout=2).close()
    except psycopg.OperationalError:
        machine_parts.missing("postgres", f"no PostgreSQL server at {PG_ADMIN}")
    name = f"relayq_test_{uuid.uuid4().hex[:12]}"
    env = {
        **os.environ,
        "RELAYQ_HOME": str(tmp_path),
        "RELAYQ_DATABASE_URL": _postgres_url(name),
        "RELAYQ_BROKER_URL": broker.url,
        "RELAYQ_KEY_PREFIX": broker.new_prefix(),
        "RELAYQ_AGENTS": AGENTS,
        "RELAYQ_BATCH_POLL": "0.2",
        "RELAYQ_POOL": "prefork",
    }
    worker = Worker(env, tmp_path / "worker.log").start()
    admin = psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=2)
    try:
        # Then it says it cannot read the active batches, and goes on
        await eventually(
            lambda: "could not read the active batches" in worker.logfile.read_text(),
            what="the warning",
        )

        # When the database appears, and a batch is started in it
        admin.execute(f'CREATE DATABASE "{name}"')
        client = DurableClient(settings=Settings.from_env(env))
        try:
            batch = await client.start_batch("paced", jobs(tag, "j", 2))

            # Then the worker finds it at a later look, and runs it
            await eventually(done_within(client, batch.batch_id, 2), timeout=30, what="batch")
        finally:
            client.close()
        assert worker.proc is not None
        assert worker.proc.poll() is None, "the worker lives on"
    finally:
        worker.stop()
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


# --- guidance and settings -----------------------------------------------------------------


async def test_relayq_batch_says_when_the_only_worker_skips_batches(tmp_path: Path, broker: Broker):
    from .test_cli_guidance import new_place

    guided = new_place(tmp_path / "guided", broker)
    guided.env["RELAYQ_BATCH_POLL"] = "0.2"
    jobs_file = guided.home / unique_name("jobs.jsonl")
    jobs_file.write_text('{"id": 1, "prompt": "hello"}\n')

    def batch(output: str, timeout: int, *more: str) -> Any:
        args = ["batch", "recall", str(jobs_file), "-o", str(guided.home / output), *more]
        return relayq(*args, "--timeout", str(timeout), env=guided.env)

    # Given a worker that skips batches: a batch is warned of, and waits
    skipper = guided.worker(RELAYQ_WORKER_BATCHES="skip")
    try:
        skipped = await asyncio.to_thread(batch, "skipped.jsonl", 2)
        # When a worker that takes batches joins it, a new batch runs, with no warning
        batcher = guided.worker(RELAYQ_WORKER_BATCHES="only")
        try:
            served = await asyncio.to_thread(batch, "served.jsonl", 30, "--new")
        finally:
            batcher.stop()
    finally:
        skipper.stop()

    assert skipped.returncode == 1
    assert (
        "relayq: warning: 1 worker running, none taking the turns of the batches of agent "
        "'recall' (queue relayq.turns; RELAYQ_WORKER_BATCHES=skip keeps a worker off them); "
        f"start one: relayq worker --agents {GUIDANCE_AGENTS}"
    ) in skipped.stderr.splitlines(), skipped.stderr
    assert served.returncode == 0, served.stderr
    assert "warning" not in served.stderr


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("RELAYQ_WORKER_BATCHES", "sometimes",
         "RELAYQ_WORKER_BATCHES must be serve, skip or only, not 'sometimes'"),
        ("RELAYQ_BATCH_POLL", "0", "RELAYQ_BATCH_POLL must be more than 0 seconds, not '0'"),
        ("RELAYQ_BATCH_POLL", "often", "RELAYQ_BATCH_POLL must be a number of seconds"),
    ],
)  # fmt: skip
def test_a_bad_batch_setting_is_one_line_naming_the_variable(
    tmp_path: Path, broker: Broker, variable: str, value: str, says: str
):
    from .test_cli_guidance import new_place

    env = {**new_place(tmp_path / "bad", broker).env, variable: value}
    for command in (["worker"], ["batches"]):
        assert error_line(relayq(*command, env=env, timeout=40)).startswith(
            f"relayq: error: {says}"
        )


def depths(place: Place) -> dict[str, float]:
    """The queue depths the API's metrics show, read as a scrape reads them."""
    settings = Settings.from_env(place.env)
    db, broker = place.db(), BrokerView(settings)
    try:
        gauges = StoreGauges(
            db, broker, queues=lambda: [TURNS], worker_timeout=timedelta(seconds=10)
        )
        families = {f.name: f for f in gauges.collect()}
    finally:
        broker.close()
        db.dispose()
    return {s.labels["queue"]: s.value for s in families["relayq_queue_depth"].samples}


def redis_of(place: Place) -> redis.Redis:
    return redis.Redis.from_url(
        place.env["RELAYQ_BROKER_URL"].replace("redis+socket://", "unix://")
    )

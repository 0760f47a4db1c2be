"""Prometheus metrics, scraped and parsed as Prometheus would: the API's `/metrics` over
real stores and brokers, a real worker's own (asyncio and prefork pools), an eager
host's, and one scrape's time over 100,000 runs and 10,000 open requests."""

from __future__ import annotations

import re
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

import tests.durable.queue_agents  # noqa: F401  (an agent on a queue of its own: its depth shows)
from relayq import Agent, Request, pricing
from relayq.providers import ProviderModel
from relayq.relay import RelayResult, relay_answer, relay_calls_of
from store import Database, RequestRow, RunRow, migrate
from store.models import DecisionRow, utcnow
from tasks import DurableClient, Settings
from tasks.broker.publish import sender_app
from tasks.observability.gauges import StoreGauges
from tasks.settings import PRIORITY_STEPS
from tests.durable.observed_agents import KEY_ENV, MODEL, metered_agent, metered_reply
from tests.durable.queue_agents import VIP_QUEUE
from tests.ports import free_port
from tests.provider_server import API_KEY, ProviderServer
from tests.seeding import insert_rows, rows_like
from tests.store.driver import statements
from tests.tasks.metric_samples import sample

from .conftest import (
    APPROVER,
    SUBMITTER,
    VIEWER,
    ApiServer,
    Durable,
    Eventually,
    SpareWorkers,
    serving,
)

Scrape = dict[str, list[Sample]]


def parse(text: str) -> Scrape:
    """Samples by name, as Prometheus's own parser reads the exposition."""
    samples: Scrape = {}
    for family in text_string_to_metric_families(text):
        for found in family.samples:
            samples.setdefault(found.name, []).append(found)
    return samples


def value(scrape: Scrape, name: str, **labels: str) -> float | None:
    """The sample `name` whose labels include `labels`; None when there is none."""
    found = [s.value for s in scrape.get(name, []) if labels.items() <= s.labels.items()]
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples"
    return found[0] if found else None


async def scrape_api(api: ApiServer, token: str | None = None) -> Scrape:
    async with api.http(token) as http:
        res = await http.get("/metrics")
    assert res.status_code == 200, res.text
    assert res.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse(res.text)


def answer_all(request: Request | None, output: str = "yes") -> Any:
    assert request is not None
    results = [RelayResult(id=c.id, output=output) for c in relay_calls_of(request)]
    return relay_answer(request.id, results)


@pytest.fixture(scope="module")
def provider() -> Iterator[ProviderServer]:
    with ProviderServer(metered_reply) as server:
        yield server


# -- the API: the store and the broker, read when scraped --------------------------------------


async def test_the_api_shows_runs_open_requests_decisions_queues_and_workers(
    api: ApiServer, durable: Durable, eventually: Eventually, prompt: str
):
    # Given a run of the session's worker that waits on a request, five minutes old (so
    # the oldest open request is at least that old)
    async with api.http(SUBMITTER) as http:
        res = await http.post("/api/runs", json={"agent": "lookup", "prompt": prompt})
    run_id = res.json()["id"]
    async with api.http(VIEWER) as http:

        async def waiting() -> Any:
            page = await http.get("/api/requests", params={"run_id": run_id, "status": "open"})
            return next(iter(page.json()["items"]), None)

        stored = await eventually(waiting, what="the run's request")
        db = durable.db()
        try:
            with db.write() as s:
                row = s.get(RequestRow, stored["request"]["id"])
                assert row is not None
                row.created_at -= timedelta(minutes=5)
        finally:
            db.dispose()
        stored = await waiting()
        listed = (await http.get("/api/requests", params={"status": "open", "limit": 1})).json()
        open_total, [first_open] = listed["total"], listed["items"]

    # When Prometheus scrapes the API
    scraped_from = datetime.now(UTC)
    before = await scrape_api(api)
    scraped_by = datetime.now(UTC)

    # Then it sees the run pending, the request open, the oldest's age ...
    assert (value(before, "relayq_runs", agent="lookup", status="pending") or 0) >= 1
    assert value(before, "relayq_runs", agent="lookup", status="cancelled") is not None
    ages = {s.labels["age"]: s.value for s in before["relayq_requests_open"]}
    assert list(ages) == ["<1m", "1m-10m", "10m-1h", "1h-6h", "6h-1d", ">1d"]
    assert ages["1m-10m"] >= 1
    assert sum(ages.values()) == open_total
    # (the oldest open request of the lane's store: the first of the oldest-first list)
    oldest = value(before, "relayq_requests_open_oldest_age_seconds")
    assert oldest is not None
    born = datetime.fromisoformat(first_open["createdAt"])
    assert born <= datetime.fromisoformat(stored["createdAt"])
    assert (
        (scraped_from - born).total_seconds() - 1
        <= oldest
        <= (scraped_by - born).total_seconds() + 1
    )
    # ... every queue relayq uses, an agent's own too, the live worker, and both parts up
    depths = {s.labels["queue"] for s in before["relayq_queue_depth"]}
    assert {"relayq.turns", "relayq.answers", "relayq.maintenance", VIP_QUEUE} <= depths
    assert value(before, "relayq_queue_unacked") is not None
    assert (value(before, "relayq_workers_alive") or 0) >= 1
    assert value(before, "relayq_store_up") == value(before, "relayq_broker_up") == 1
    assert value(before, "relayq_metrics_collect_seconds", part="store") is not None
    # ... and this process's own series (prometheus_client's process collector)
    assert "process_cpu_seconds_total" in before

    # When a person answers the request
    async with api.http(APPROVER) as http:
        calls = stored["request"]["data"]["calls"]
        results = [{"id": c["id"], "output": "found"} for c in calls]
        res = await http.post(
            f"/api/requests/{stored['request']['id']}/answer",
            json={"ok": True, "data": {"results": results}},
        )
        assert res.status_code == 200, res.text
    after = await scrape_api(api)

    # Then its wait (from the request's creation: five minutes ago) is in the decision
    # histogram
    count = "relayq_request_decision_seconds_count"
    was = value(before, count, agent="lookup", outcome="answered") or 0
    assert value(after, count, agent="lookup", outcome="answered") == was + 1
    bucket = "relayq_request_decision_seconds_bucket"
    inf = value(after, bucket, agent="lookup", outcome="answered", le="+Inf")
    assert inf == was + 1
    total = "relayq_request_decision_seconds_sum"
    waited = (value(after, total, agent="lookup", outcome="answered") or 0) - (
        value(before, total, agent="lookup", outcome="answered") or 0
    )
    assert 300 <= waited < 360


@pytest.fixture
def quiet(durable: Durable) -> Settings:
    """The session's settings on a key prefix of their own, which no worker consumes."""
    return replace(durable.settings, key_prefix=durable.broker.new_prefix())


async def test_queue_depth_counts_every_priority_and_the_messages_workers_hold(quiet: Settings):
    # Given messages waiting in relayq's queues on a broker no worker reads, at each of
    # the three priorities (kombu keeps each in a list of its own), and two workers hold
    sender = sender_app(quiet)
    try:
        for priority in PRIORITY_STEPS:
            sender.send_task("relayq.nothing", queue="relayq.turns", priority=priority)
        sender.send_task("relayq.nothing", queue="relayq.answers")
    finally:
        sender.close()
    conn = redis.Redis.from_url(quiet.broker_url.replace("redis+socket://", "unix://"))
    conn.hset(quiet.key_prefix + "unacked", mapping={"t1": "{}", "t2": "{}"})
    lists = [k for k in conn.scan_iter(match=f"{quiet.key_prefix}relayq.turns*")]
    conn.close()
    assert len(lists) == 3, lists

    # When the API is scraped
    with serving(quiet) as api:
        scraped = await scrape_api(api)

    # Then each queue's depth is all its priorities', and the held ones are counted
    assert value(scraped, "relayq_queue_depth", queue="relayq.turns") == 3
    assert value(scraped, "relayq_queue_depth", queue="relayq.answers") == 1
    assert value(scraped, "relayq_queue_depth", queue="relayq.maintenance") == 0
    assert value(scraped, "relayq_queue_depth", queue=VIP_QUEUE) == 0
    assert value(scraped, "relayq_queue_unacked") == 2


async def test_a_broker_that_does_not_answer_is_reported_down_and_the_store_still_read(
    durable: Durable,
):
    closed = free_port()
    settings = replace(durable.settings, broker_url=f"redis://127.0.0.1:{closed}/0")

    with serving(settings) as api:
        scraped = await scrape_api(api)

    assert value(scraped, "relayq_broker_up") == 0
    assert value(scraped, "relayq_store_up") == 1
    assert "relayq_queue_depth" not in scraped
    # The store's counts, read: the workers alive always has its sample (`relayq_runs`
    # has none on a store with no run yet)
    assert value(scraped, "relayq_workers_alive") is not None


async def test_metrics_take_no_token_unless_relayq_metrics_token_is_set(
    api: ApiServer, monkeypatch: pytest.MonkeyPatch
):
    async with api.http() as http:
        assert (await http.get("/metrics")).status_code == 200

    monkeypatch.setenv("RELAYQ_METRICS_TOKEN", "scrape-me-7f3a")
    async with api.http() as http:
        missing = await http.get("/metrics")
        wrong = await http.get("/metrics", headers={"Authorization": "Bearer nope"})
        api_token = await http.get("/metrics", headers={"Authorization": f"Bearer {VIEWER}"})
        in_url = await http.get(
            "/metrics",
            params={"token": "scrape-me-7f3a"},
            headers={"Authorization": "Bearer scrape-me-7f3a"},
        )
        right = await http.get("/metrics", headers={"Authorization": "Bearer scrape-me-7f3a"})
    assert [r.status_code for r in (missing, wrong, api_token, in_url)] == [401] * 4
    assert "scrape-me-7f3a" not in missing.text + wrong.text + in_url.text
    assert right.status_code == 200
    assert value(parse(right.text), "relayq_workers_alive") is not None


# -- a worker's own metrics ---------------------------------------------------------------------


@pytest.mark.parametrize("pool", ["asyncio", "prefork"])
async def test_a_worker_serves_its_turns_model_calls_tokens_and_429s(
    durable: Durable,
    spare_workers: SpareWorkers,
    provider: ProviderServer,
    eventually: Eventually,
    pool: str,
):
    # Given a worker with its metrics on a port, on a provider that throttles once
    port = free_port()
    spare = spare_workers.start(
        RELAYQ_AGENTS="tests.durable.agents,tests.durable.observed_agents",
        RELAYQ_POOL=pool,
        RELAYQ_WORKER_METRICS_PORT=str(port),
        RELAYQ_WORKER_METRICS_ADDR="127.0.0.1",
        RELAYQ_TEST_PROVIDER_URL=provider.openai_url,
        RELAYQ_TEST_PROVIDER_KEY=API_KEY,
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
    )
    prompt = f"please throttle then confirm order {uuid.uuid4().hex[:8]}"

    # When a run meets a 429, halts on its request, is answered and ends
    async with DurableClient(settings=spare.settings) as client:
        run_id = await client.start("metered", prompt)
        halted = await client.result(run_id, wait=True, timeout=30)
        assert halted.status == "pending", halted.error
        await client.submit_answer(answer_all(halted.pending))

        async def finished() -> bool:
            return (await client.result(run_id)).status == "done"

        await eventually(finished, what="the run to finish")

    # Then the worker's /metrics counts its three turns, three model calls (one a 429),
    # the tokens the provider reported, and the 429
    def scraped() -> Scrape | None:
        res = httpx.get(f"http://127.0.0.1:{port}/metrics", trust_env=False)
        found = parse(res.text)
        done = value(found, "relayq_turn_duration_seconds_count", agent="metered", outcome="done")
        return found if done == 1 else None

    found: Scrape = await eventually(scraped, what="the worker's metrics")
    turns = {
        s.labels["outcome"]: s.value
        for s in found["relayq_turn_duration_seconds_count"]
        if s.labels["agent"] == "metered"
    }
    assert turns == {"retry": 1, "pending": 1, "done": 1}
    calls = "relayq_model_calls_total"
    where = {"agent": "metered", "provider": "127.0.0.1", "model": MODEL}
    assert value(found, calls, **where, result="ok") == 2
    assert value(found, calls, **where, result="rate_limited") == 1
    assert value(found, "relayq_model_tokens_total", **where, kind="prompt") == 20 + 11
    assert value(found, "relayq_model_tokens_total", **where, kind="completion") == 5 + 7
    assert value(found, "relayq_model_call_duration_seconds_count", provider="127.0.0.1") == 3
    limited = "relayq_provider_rate_limited_total"
    assert value(found, limited, provider="127.0.0.1", model=MODEL, status="429") == 1
    assert "relayq_model_cost_total" not in found, "no prices, no cost"
    assert value(found, "process_resident_memory_bytes") is not None
    # ... and the prefork worker's folder of counts goes when it stops
    log = spare.worker.logfile.read_text()
    assert f"worker metrics at http://127.0.0.1:{port}/metrics" in log
    folder = re.search(r"every process's counts in (\S+)", log)
    assert folder is not None
    spare.worker.stop()
    assert not Path(folder.group(1)).exists()  # noqa: ASYNC240 (one stat)


def test_a_worker_refuses_a_metrics_port_that_is_no_port(durable: Durable, tmp_path: Path):
    from tests.durable.conftest import Worker

    worker = Worker({**durable.env, "RELAYQ_WORKER_METRICS_PORT": "nine"}, tmp_path / "w.log")
    with pytest.raises(RuntimeError, match="did not start"):
        worker.start(ready_timeout=30)
    worker.stop()
    assert "RELAYQ_WORKER_METRICS_PORT must be a port number" in worker.logfile.read_text()


# -- an eager host's own metrics and cost ------------------------------------------------------


@pytest.fixture
async def metered(provider: ProviderServer) -> AsyncIterator[Agent]:
    agent = metered_agent(provider.openai_url, register=False)
    yield agent
    assert isinstance(agent.durable_model, ProviderModel)
    await agent.durable_model.aclose()


@pytest.fixture
async def eager(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[DurableClient]:
    monkeypatch.setenv(KEY_ENV, API_KEY)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    settings = Settings.load(
        env={
            "RELAYQ_HOME": str(tmp_path),
            "RELAYQ_DATABASE_URL": database_url,
            "RELAYQ_BROKER_URL": "redis://127.0.0.1:1/0",
        }
    )
    client = DurableClient(eager=True, settings=settings)
    yield client
    client.close()
    pricing.set_cost_function(pricing.provider_prices)


async def test_an_eager_host_counts_its_turns_and_prices_them_once_a_cost_function_is_set(
    eager: DurableClient, metered: Agent
):
    where = {"agent": "metered", "provider": "127.0.0.1", "model": MODEL}
    cost, prompt_tokens = (
        sample("relayq_model_cost_total", **where),
        sample("relayq_model_tokens_total", **where, kind="prompt"),
    )
    turns = sample("relayq_turn_duration_seconds_count", agent="metered", outcome="pending")

    # Given prices: a cent per thousand prompt tokens, two per thousand completion tokens
    pricing.set_cost_function(
        lambda agent, usage: (usage.prompt_tokens * 0.01 + usage.completion_tokens * 0.02) / 1000
    )
    # When an eager run halts on its request, then ends
    halted = await eager.run(metered, f"confirm order {uuid.uuid4().hex[:8]}")
    assert halted.pending is not None
    done = await eager.run_with_answer(halted.pending, answer_all(halted.pending))

    # Then this process counted its turns, tokens and their cost
    assert done.status == "done"
    assert sample("relayq_turn_duration_seconds_count", agent="metered", outcome="pending") == (
        turns + 1
    )
    assert sample("relayq_model_tokens_total", **where, kind="prompt") == prompt_tokens + 31
    spent = sample("relayq_model_cost_total", **where) - cost
    assert spent == pytest.approx((31 * 0.01 + 12 * 0.02) / 1000)


# -- at volume ----------------------------------------------------------------------------------

RUNS, OPEN, DECIDED = 100_000, 10_000, 5_000
SCRAPE_STATEMENTS = 8
"""A scrape's statements (three transactions' BEGINs among them), as on an empty store."""


def age(n: int) -> int:
    """Seconds the n-th seeded request is old: spread over two days."""
    return (n * 17) % (2 * 86400)


def seed(db: Database) -> None:
    """100,000 runs of five agents in every status, 10,000 open requests of every age up to
    two days, 5,000 answered ones, each with its decision, made in the last minute."""
    now = utcnow()
    statuses = ("done", "done", "done", "failed", "pending", "queued", "running", "cancelled")
    run = RunRow(id="", agent="", conversation_id="", status="done", created_at=now, updated_at=now)
    runs = rows_like(
        run,
        RUNS,
        lambda n: {
            "id": f"run_v{n:06d}",
            "agent": f"agent-{n % 5}",
            "conversation_id": f"run_v{n:06d}",
            "status": statuses[n % len(statuses)],
        },
    )
    request = RequestRow(id="", run_id="", agent="", kind="tool_call", prompt="p")
    requests = rows_like(
        request,
        OPEN + DECIDED,
        lambda n: {
            "id": f"req_v{n:06d}",
            "run_id": f"run_v{n:06d}",
            "agent": f"agent-{n % 5}",
            "status": "open" if n < OPEN else "answered",
            "outcome": None if n < OPEN else "answered",
            "created_at": now - timedelta(seconds=age(n)),
            "answered_at": None if n < OPEN else now - timedelta(seconds=n % 50),
        },
    )
    decision = DecisionRow(
        request_id="", run_id="", agent="", call_ids=[], actor="ann", groups=[], via="api",
        outcome="answered", at=now,
    )  # fmt: skip
    decisions = [
        {k: v for k, v in row.items() if k != "id"}
        for row in rows_like(
            decision,
            DECIDED,
            lambda n: {
                "request_id": f"req_v{OPEN + n:06d}",
                "run_id": f"run_v{OPEN + n:06d}",
                "agent": f"agent-{(OPEN + n) % 5}",
                "at": now - timedelta(seconds=(OPEN + n) % 50),
            },
        )
    ]
    insert_rows(db, RunRow, runs)
    insert_rows(db, RequestRow, requests)
    insert_rows(db, DecisionRow, decisions)


def test_a_scrape_reads_100k_runs_and_10k_open_requests_in_a_few_statements(
    private_database: str, capsys: pytest.CaptureFixture[str]
):
    # Given a store with 100,000 runs, 10,000 open requests and 5,000 fresh decisions
    db = Database(private_database)
    try:
        migrate(db)
        seed(db)
        gauges = StoreGauges(
            db,
            None,
            queues=lambda: [],
            worker_timeout=timedelta(seconds=10),
            decisions_since=utcnow() - timedelta(minutes=5),
        )

        # When it is scraped, five times
        times, statements_run = [], []
        for _ in range(5):
            started = time.perf_counter()
            with statements(db) as seen:
                families = {f.name: f for f in gauges.collect()}
            times.append(time.perf_counter() - started)
            statements_run.append(len(seen))
    finally:
        db.dispose()

    # Then every scrape saw it all, and took well under a second
    runs = sum(s.value for s in families["relayq_runs"].samples)
    assert runs == RUNS
    assert sum(s.value for s in families["relayq_requests_open"].samples) == OPEN
    oldest = families["relayq_requests_open_oldest_age_seconds"].samples[0].value
    seeded = max(age(n) for n in range(OPEN))
    assert seeded <= oldest <= seeded + 60
    counts = [
        s.value
        for s in families["relayq_request_decision_seconds"].samples
        if s.name.endswith("_count")
    ]
    assert sum(counts) == DECIDED
    with capsys.disabled():
        kind = "postgresql" if private_database.startswith("postgresql") else "sqlite"
        print(
            f"\nscrape of {RUNS:,} runs, {OPEN:,} open requests ({kind}): first "
            f"{times[0] * 1000:.0f} ms, median {statistics.median(times) * 1000:.0f} ms"
        )
    # ... in a few statements, whatever the store holds: each an aggregate, but the decisions
    # of the last minutes (how long it took is printed; a test asserts no timing)
    assert max(statements_run) <= SCRAPE_STATEMENTS, statements_run

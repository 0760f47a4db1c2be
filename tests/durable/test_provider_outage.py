"""A provider outage, with real workers and a real model server process killed under them.

The benchmark's agent (`bench.agents`, a run is `TURNS` model calls) against
`bench.model_server` in a process of its own: SIGKILL makes the provider
unreachable (connections refused), starting it again on the same port brings
it back. The session's settings give a failing call two retries with backoff
from 0.02 s (RELAYQ_MODEL_RETRIES=2, RELAYQ_RETRY_BASE=0.02): the whole retry
budget of a run is spent in a fraction of a second. The provider stays down
until its circuit has failed `PROBES` probes 0.2 s apart, far longer than that.
Nothing here asserts a duration: counts, states, and what the runs stored.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterator

import pytest
import redis
from typer.testing import CliRunner

from bench.model_server import ServerProcess
from cli.main import app as cli_app
from relayq import RunResult
from store import FINISHED
from tasks import DurableClient
from tasks.broker.circuit import CircuitView, read_circuits
from tests.ports import free_port

from .conftest import SQLITE_ONLY, Durable, Eventually, SpareWorkers, serving
from .test_batches import runs_of
from .test_metrics import scrape_api, value

pytestmark = [pytest.mark.timeout(150), SQLITE_ONLY]

TURNS = 3
RUNS = 8
PROBES = 6
"""Probes the circuit fails before the provider comes back: 1.2 s of an outage."""
PROVIDER = "127.0.0.1/bench-model"


@pytest.fixture
def model_server() -> Iterator[ServerProcess]:
    server = ServerProcess(free_port(), "--latency", "0.05", "--turns", str(TURNS)).start()
    yield server
    server.kill()


def start_worker(spare_workers: SpareWorkers, server: ServerProcess, **env: str) -> Durable:
    """A worker of its own serving the benchmark's agent against `server`."""
    return spare_workers.start(
        RELAYQ_AGENTS="bench.agents",
        RELAYQ_BENCH_MODEL_URL=server.url,
        RELAYQ_BENCH_KEY="bench-key",
        RELAYQ_CONCURRENCY="20",
        RELAYQ_PROVIDER_PROBE_EVERY="0.2",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
        **env,
    )


async def start_batch(client: DurableClient) -> str:
    tag = uuid.uuid4().hex[:8]
    started = await client.start_batch("bench", [(f"j{i}", f"{tag} {i}") for i in range(RUNS)])
    return started.batch_id


def circuits(spare: Durable, batch_id: str | None = None) -> list[CircuitView]:
    client = redis.Redis.from_url(spare.settings.redis_url or "")
    try:
        return read_circuits(client, spare.settings.key_prefix, batch_id=batch_id)
    finally:
        client.close()


async def provider_down_a_while(
    server: ServerProcess, spare: Durable, batch_id: str, eventually: Eventually
) -> None:
    """Kill the provider once the batch's runs are under way, and wait until its circuit
    has failed PROBES probes (or every run has ended: no wait is left to outlast)."""
    await eventually(lambda: int(server.stats()["answered"] or 0) >= RUNS, what="first turns")
    server.kill()

    def probed() -> bool:
        if all(r.status in FINISHED for r in runs_of(spare, batch_id)):
            return True
        return any(v.provider == PROVIDER and v.probes >= PROBES for v in circuits(spare))

    await eventually(probed, timeout=60, what=f"{PROBES} failed probes")


async def results_of(client: DurableClient, spare: Durable, batch_id: str) -> list[RunResult]:
    """Each run's result once it has ended."""
    return [await client.result(r.id, wait=True, timeout=60) for r in runs_of(spare, batch_id)]


async def test_runs_ride_out_an_outage_longer_than_their_retries_without_spending_a_try(
    spare_workers: SpareWorkers, model_server: ServerProcess, eventually: Eventually
):
    # Given a worker, and a batch of runs under way against the model server
    spare = start_worker(spare_workers, model_server)
    async with DurableClient(settings=spare.settings) as client:
        batch_id = await start_batch(client)

        # When the server is killed for far longer than a run's whole retry budget, then
        # started again
        await provider_down_a_while(model_server, spare, batch_id, eventually)
        model_server.start()

        # Then every run ends done, none failed
        results = await results_of(client, spare, batch_id)
    assert [r.status for r in results] == ["done"] * RUNS, {r.error for r in results}
    # ... no run's tries were spent by the outage, and none keeps its errors
    runs = runs_of(spare, batch_id)
    assert [(r.attempts, r.error) for r in runs] == [(0, None)] * RUNS
    # ... and the circuit is closed again (no keys left)
    assert circuits(spare) == []
    log = spare.worker.logfile.read_text(errors="replace")
    assert log.count(f"provider {PROVIDER} is down (unreachable): circuit open since") >= 1
    assert f"provider {PROVIDER} answers again: circuit closed" in log


@pytest.fixture
def long_model_server() -> Iterator[ServerProcess]:
    """A model server whose runs take 40 calls: none can end in the moment between the
    server's count of answers being seen and its kill, however loaded the machine."""
    server = ServerProcess(free_port(), "--latency", "0.05", "--turns", "40").start()
    yield server
    server.kill()


async def test_a_provider_down_past_the_outage_limit_fails_its_runs_saying_so(
    spare_workers: SpareWorkers, long_model_server: ServerProcess, eventually: Eventually
):
    # Given a worker whose runs may wait 2 s for a provider that is down
    model_server = long_model_server
    spare = start_worker(spare_workers, model_server, RELAYQ_PROVIDER_OUTAGE_LIMIT="2")
    async with DurableClient(settings=spare.settings) as client:
        batch_id = await start_batch(client)

        # When the server is killed for good
        await eventually(lambda: int(model_server.stats()["answered"] or 0) >= RUNS)
        model_server.kill()

        # Then every run fails with the outage's error, not the retries'
        results = await results_of(client, spare, batch_id)
    assert [r.status for r in results] == ["failed"] * RUNS
    for result in results:
        assert result.error is not None
        assert f"provider {PROVIDER} down since" in result.error
        assert "(unreachable)" in result.error
        assert "the limit (RELAYQ_PROVIDER_OUTAGE_LIMIT) is 2 s" in result.error
        assert "gave up after" not in result.error


async def test_batch_status_and_metrics_show_the_provider_waited_on_while_it_is_down(
    spare_workers: SpareWorkers, model_server: ServerProcess, eventually: Eventually
):
    # Given a batch under way, and its provider killed a while
    spare = start_worker(spare_workers, model_server)
    async with DurableClient(settings=spare.settings) as client:
        batch_id = await start_batch(client)
        await provider_down_a_while(model_server, spare, batch_id, eventually)

        # When the batch's status and the API's metrics are asked for
        status = await asyncio.to_thread(
            CliRunner().invoke,
            cli_app,
            ["batch", "status", batch_id],
            env={**spare.env, "COLUMNS": "250"},
        )
        with serving(spare.settings) as api:
            scrape = await scrape_api(api)

        # Then the status says which provider its runs wait on, and since when
        assert status.exit_code == 0, status.output
        assert f"waiting on provider {PROVIDER} since " in status.output
        # open, or half-open while a probe is out: which one depends on the moment asked
        assert re.search(r"its circuit is (open|half-open) \(unreachable\)", status.output)
        # ... and the metrics show the circuit open (or half-open, as above), and the runs
        # waiting for it
        labels = {"provider": "127.0.0.1", "model": "bench-model"}
        states = {
            state: value(scrape, "relayq_provider_circuit", state=state, **labels)
            for state in ("open", "half_open")
        }
        assert sorted(v or 0 for v in states.values()) == [0, 1], states
        assert value(scrape, "relayq_provider_circuit", state="closed", **labels) == 0
        assert (value(scrape, "relayq_provider_circuit_open_seconds", **labels) or 0) > 0
        assert value(scrape, "relayq_provider_runs_waiting", **labels) == RUNS

        # ... and once the provider is back, the runs end done and the circuit shows closed
        model_server.start()
        results = await results_of(client, spare, batch_id)
        assert {r.status for r in results} == {"done"}
        with serving(spare.settings) as api:
            scrape = await scrape_api(api)
        assert value(scrape, "relayq_provider_circuit", state="closed", **labels) == 1

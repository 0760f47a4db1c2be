"""One worker process keeps many turns in flight: the asyncio pool (`workers.aio`)."""

from __future__ import annotations

import asyncio

from tasks import DurableClient

from .conftest import Durable, SpareWorkers


async def test_one_worker_process_holds_many_model_calls_in_flight_at_once(
    durable: Durable, spare_workers: SpareWorkers, prompt: str
):
    # Given one worker process on the default pool, and a model that answers only
    # when 40 of its calls wait at the same moment
    spare = spare_workers.start(
        RELAYQ_TEST_CROWD="40", RELAYQ_MODEL_RETRIES="0", RELAYQ_CONCURRENCY="50"
    )

    # When 40 runs start at once
    async with DurableClient(settings=spare.settings) as client:
        ids = [await client.start("crowd", f"{prompt} {i}") for i in range(40)]
        results = await asyncio.gather(*(client.result(i, wait=True, timeout=60) for i in ids))

    # Then all 40 calls were in flight together, and every run finished
    assert [r.status for r in results] == ["done"] * 40, {r.error for r in results}
    assert {r.text for r in results} == {"together"}


async def test_a_prefork_worker_with_two_processes_cannot_hold_them(
    durable: Durable, spare_workers: SpareWorkers, prompt: str
):
    # The same crowd on prefork with two processes: the model gives up, so the
    # test above really measures concurrency.
    spare = spare_workers.start(
        RELAYQ_POOL="prefork",
        RELAYQ_TEST_CROWD="4",
        RELAYQ_TEST_CROWD_WAIT="2",
        RELAYQ_MODEL_RETRIES="0",
    )
    async with DurableClient(settings=spare.settings) as client:
        ids = [await client.start("crowd", f"{prompt} {i}") for i in range(4)]
        results = await asyncio.gather(*(client.result(i, wait=True, timeout=60) for i in ids))

    assert all(r.status == "failed" for r in results)
    assert all("in flight at once" in (r.error or "") for r in results)

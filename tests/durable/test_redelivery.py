"""A turn message delivered twice, or a copy sent again, never takes its turn twice."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from relayq import RunResult
from tasks import DurableClient

from .conftest import Durable, Eventually, SpareWorkers


def _check_resumed_not_repeated(durable: Durable, prompt: str, res: RunResult) -> None:
    assert res.run_id is not None
    run_id = res.run_id
    assert res.status == "done", res.error
    assert durable.count("model", prompt) == 2, "turn 1 once, the final turn once"
    assert durable.count("tool", f"work {run_id}") == 1, "a finished tool is read from the ledger"
    assert durable.count("tool", f"crash {run_id}") == 2, "the interrupted tool runs again"
    survived = f"survived {run_id}:1:c2 attempt 2"
    assert res.text == f"worked,{survived}", "the same key, and the second attempt"
    assert [c.output for c in res.tool_calls] == ["worked", survived]


async def test_a_redelivered_turn_neither_calls_the_model_again_nor_reruns_a_finished_tool(
    durable: Durable, spare_workers: SpareWorkers, prompt: str
):
    # Given a prefork worker (of this test's own: the crash may take it down), and
    # a turn whose second tool kills the pool process the first time it runs,
    # after the first tool has finished and reached the ledger
    spare = spare_workers.start(RELAYQ_POOL="prefork")

    # When the worker rejects the lost message and the broker delivers it again
    async with DurableClient(settings=spare.settings) as client:
        res = await client.run("crashy", prompt, timeout=60)

    # Then the redelivery resumes the saved turn instead of starting it over
    _check_resumed_not_repeated(durable, prompt, res)


async def test_a_turn_whose_worker_died_finishes_once_a_new_worker_starts(
    durable: Durable, spare_workers: SpareWorkers, prompt: str, eventually: Eventually
):
    # Given a worker as `python -m workers worker` starts it, with the default
    # recovery settings, and the same crashing turn
    spare = spare_workers.start()
    async with DurableClient(settings=spare.settings) as client:
        run_id = await client.start("crashy", prompt)

        # When the crash takes down the whole worker process, a supervisor starts another
        async def finished() -> RunResult | None:
            nonlocal spare
            if spare.worker.proc is not None and spare.worker.proc.poll() is not None:
                spare = spare_workers.restart(spare)
            res = await client.result(run_id)
            return res if res.status not in ("queued", "running") else None

        # Then the turn is delivered again promptly, resumed and not repeated
        res = await eventually(finished, timeout=20, what="the crashed turn to be redelivered")
    _check_resumed_not_repeated(durable, prompt, res)


async def test_a_turn_that_kills_its_worker_every_time_fails_after_the_crash_limit(
    durable: Durable, spare_workers: SpareWorkers, private_database: str, prompt: str
):
    # Given a prefork worker allowed 2 crashes per turn, on a database of its own
    # (the session's worker sweeps the shared one and would take the run over),
    # and a turn whose tool kills the pool process every time it runs
    spare = spare_workers.start(
        RELAYQ_POOL="prefork", RELAYQ_CRASH_LIMIT="2", RELAYQ_DATABASE_URL=private_database
    )

    # When the run starts, and its turn is taken over after each death
    async with DurableClient(settings=spare.settings) as client:
        res = await client.run("doomed", prompt, timeout=60)

    # Then the turn ran twice (the first try and one takeover: a prefork child runs one
    # turn, so each death is that turn's), and the run failed, saying why, rather than
    # taking workers down forever
    assert res.run_id is not None
    assert (res.status, res.error) == (
        "failed",
        "the tool `doom` (call c1) killed its worker 2 times, in turn 1; giving up",
    )
    assert durable.count("tool", f"doom {res.run_id}") == 2


async def test_a_duplicate_turn_message_is_skipped_and_the_run_finishes_once(
    durable: Durable,
    client: DurableClient,
    prompt: str,
    eventually: Eventually,
    acked: Callable[[str], bool],
):
    # Given a run whose first turn is in flight on the worker, its tool held
    run_id = await client.start("holding", prompt)
    release = durable.log / f"release-{run_id}"
    try:
        await eventually(
            lambda: durable.count("tool", f"hold {run_id}") == 1, what="the tool to start"
        )

        # When a second copy of its message (same arguments, another task id) is
        # sent, and handled while the turn still runs
        copy_id = f"duplicate-{uuid.uuid4().hex}"
        client.app.send_task(
            "relayq.run_turn", args=[run_id, 0], queue="relayq.turns", task_id=copy_id
        )
        await eventually(lambda: acked(copy_id), what="the copy to be handled mid-turn")
        assert (await client.result(run_id)).status == "running"
    finally:
        release.touch()

    # Then the run finished once, each of its two turns taken once
    res = await client.result(run_id, wait=True, timeout=30)
    assert res.status == "done", res.error
    assert res.text == "released"
    assert durable.count("model", prompt) == 2, "two turns, no turn taken twice"
    assert durable.count("tool", f"hold {run_id}") == 1
    assert await client.result(run_id) == res


async def test_an_old_turn_message_sent_after_the_run_is_done_changes_nothing(
    durable: Durable,
    client: DurableClient,
    prompt: str,
    eventually: Eventually,
    acked: Callable[[str], bool],
):
    # Given a finished run
    res = await client.run("two-step", prompt, timeout=30)
    assert res.status == "done", res.error
    assert res.run_id is not None
    run_id = res.run_id

    # When copies of both its turn messages are sent again, and handled
    copies = [f"stale-{uuid.uuid4().hex}" for _ in range(2)]
    for version, task_id in zip((0, 2), copies, strict=True):
        client.app.send_task(
            "relayq.run_turn", args=[run_id, version], queue="relayq.turns", task_id=task_id
        )
    for task_id in copies:
        await eventually(lambda t=task_id: acked(t), what=f"{task_id} to be handled")

    # Then the run is as it was
    assert await client.result(run_id) == res
    assert durable.count("model", prompt) == 2
    assert durable.count("tool", f"step {run_id}") == 1

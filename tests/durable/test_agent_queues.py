"""An agent's own queue: its turns go there, from the first to the last, and only a worker
started with `-Q` naming it runs them."""

from __future__ import annotations

from relayq.relay import RelayResult, relay_answer, relay_calls_of
from store import OutboxRow
from tasks import DurableClient
from tests.durable.queue_agents import VIP_QUEUE

from .conftest import Durable, SpareWorkers

AGENTS = "tests.durable.agents,tests.durable.queue_agents"
RELAYQ_QUEUES = "relayq.turns,relayq.answers,relayq.maintenance"


async def test_an_agents_turns_run_only_on_a_worker_listening_on_its_queue(
    spare_workers: SpareWorkers, prompt: str
):
    # Given a worker on relayq's own queues that knows the agent
    general = spare_workers.start(
        "-Q", RELAYQ_QUEUES, RELAYQ_AGENTS=AGENTS, RELAYQ_TEST_WORKER="general"
    )
    client = DurableClient(settings=general.settings)
    try:
        # When a run of the agent is started, its first turn waits on the agent's queue
        run_id = await client.start("vip", prompt)
        assert "which this worker does not consume" in general.worker.logfile.read_text()
        # ... while a run started after it, on relayq's own queue, has come and gone
        later = await client.start("two-step", f"{prompt} after")
        assert (await client.result(later, wait=True, timeout=30)).status == "done"
        assert (await client.result(run_id)).status == "queued"

        # Then a worker started on that queue alone (same broker prefix) runs it ...
        spare_workers._launch({**general.env, "RELAYQ_TEST_WORKER": "vip"}, ("-Q", VIP_QUEUE))
        halted = await client.result(run_id, wait=True, timeout=30)
        assert halted.status == "pending", halted.error
        assert halted.pending is not None

        # ... and, once the general worker has applied the answer, its next turn too
        [call] = relay_calls_of(halted.pending)
        answer = relay_answer(halted.pending.id, [RelayResult(id=call.id, output="found")])
        done = await client.run_with_answer(halted.pending, answer, timeout=30)
    finally:
        client.close()

    assert done.status == "done", done.error
    assert done.text == "tool on vip | found | text on vip"


def test_every_turn_message_of_the_run_names_the_agents_queue(durable: Durable):
    # The rows of the runs above (and of any other vip run): each turn went to the agent's queue.
    db = durable.db()
    try:
        from sqlmodel import select

        with db.read() as s:
            rows = [r for r in s.exec(select(OutboxRow)) if "agent=vip " in r.label]
    finally:
        db.dispose()
    assert {r.queue for r in rows} <= {VIP_QUEUE}

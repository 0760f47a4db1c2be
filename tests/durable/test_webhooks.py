"""Outbound webhooks from a real worker: a real run's events delivered over real HTTP to a
local receiver, signed and as Slack lines, also to a receiver that is down for a while. The
configuration, the signature, the bodies and the sender on its own: tests/tasks/test_webhooks.py."""

from __future__ import annotations

import json
import uuid

import pytest

from relayq.relay import answer_output
from store import Database
from store.models import EventRow
from store.webhooks import delivery_log, list_deliveries
from tasks import DurableClient
from tests.ports import free_port
from tests.tasks.webhook_signing import SECRET, signed
from tests.webhook_receiver import Received, Receiver

from .conftest import Eventually, SpareWorkers


async def finished_run(client: DurableClient, prompt: str) -> tuple[str, str]:
    """A `lookup` run halted on its request, answered, and done: (run id, request id)."""
    halted = await client.run("lookup", prompt, timeout=30)
    assert halted.status == "pending", halted.error
    assert halted.pending is not None
    assert halted.run_id is not None
    answer = answer_output(halted.pending.id, "found")
    done = await client.run_with_answer(halted.pending, answer, timeout=30)
    assert done.status == "done", done.error
    return halted.run_id, halted.pending.id


def events_of(db: Database, run_id: str) -> set[str]:
    with db.read() as s:
        rows = s.execute(
            EventRow.__table__.select().where(EventRow.__table__.c.run_id == run_id)  # type: ignore[attr-defined]
        ).all()
    return {r.id for r in rows}


async def test_a_workers_webhooks_carry_a_runs_events_signed_and_as_slack_lines(
    spare_workers: SpareWorkers, eventually: Eventually, prompt: str, private_database: str
):
    # Given a worker with a JSON endpoint for everything and a Slack one for new requests
    tag = uuid.uuid4().hex[:8]
    with Receiver() as receiver:
        hooks = [
            {"name": f"json-{tag}", "url": receiver.url("/json"), "secret": SECRET},
            {"name": f"slack-{tag}", "url": receiver.url("/slack"), "format": "slack",
             "events": ["request.opened"]},
        ]  # fmt: skip
        # On a database of its own: a new endpoint also gets the last hour's events,
        # and the session's store holds thousands from other tests.
        spare = spare_workers.start(
            RELAYQ_WEBHOOKS=json.dumps(hooks),
            RELAYQ_PUBLIC_URL="https://relayq.example",
            RELAYQ_DATABASE_URL=private_database,
        )
        client = DurableClient(settings=spare.settings)
        db = spare.db()
        try:
            # When a run opens a request, is answered and finishes
            run_id, request_id = await finished_run(client, prompt)
            expected = events_of(db, run_id)

            # Then the JSON endpoint gets each of its events, signed; Slack gets the request
            def of_run() -> list[Received]:
                return [r for r in receiver.got() if r.path == "/json"
                        and r.json()["data"].get("runId") == run_id]  # fmt: skip

            await eventually(
                lambda: {r.event_id for r in of_run()} == expected, what="the run's events"
            )
            slack = await eventually(
                lambda: [
                    r
                    for r in receiver.got()
                    if r.path == "/slack" and request_id in r.body.decode()
                ],
                what="the Slack message",
            )
        finally:
            client.close()
            db.dispose()

    types = {r.json()["type"] for r in of_run()}
    assert {"request.opened", "run.finished"} <= types
    assert all(signed(r) and r.json()["id"] == r.event_id for r in of_run())
    [message] = slack
    assert message.headers["X-Relayq-Event-Type"] == "request.opened"
    text = message.json()["text"]
    assert f"<https://relayq.example/requests/{request_id}|open request>" in text
    assert "`lookup` for agent `lookup`" in text


@pytest.mark.timeout(240)
async def test_a_receiver_down_for_a_while_gets_every_event_once_it_is_up(
    spare_workers: SpareWorkers, eventually: Eventually, prompt: str, private_database: str
):
    # Given a worker whose receiver is down: nothing listens on its port
    port, name = free_port(), f"down-{uuid.uuid4().hex[:8]}"
    hooks = [{"name": name, "url": f"http://127.0.0.1:{port}/hooks", "secret": SECRET}]
    spare = spare_workers.start(
        RELAYQ_WEBHOOKS=json.dumps(hooks),
        RELAYQ_WEBHOOK_RETRY_BASE="0.05",
        RELAYQ_DATABASE_URL=private_database,
    )
    client = DurableClient(settings=spare.settings)
    db = spare.db()
    try:
        # When a run's events happen while it is down, and each is tried (and logged) twice
        run_id, _ = await finished_run(client, prompt)
        expected = events_of(db, run_id)

        def tried_twice() -> bool:
            log = [a for e in expected for a in delivery_log(db, event_id=e, endpoint=name)]
            return all(sum(a.event_id == e for a in log) >= 2 for e in expected)

        # (a new worker's start and its backoffs: over 30 s once, beside a full suite)
        await eventually(tried_twice, timeout=90, what="two failed attempts of each event")
        assert all(a.error and a.status is None for a in delivery_log(db, endpoint=name))

        # And then it comes up, answering 500 to each event's first delivery
        with Receiver(port=port, fail_first=True) as receiver:

            def taken() -> set[str]:
                return {r.event_id for r in receiver.got() if r.status == 200} & expected

            await eventually(lambda: taken() == expected, timeout=90, what="every event, once up")
            got = [r for r in receiver.got() if r.event_id in expected]

        # Then nothing was lost, and each repeat carries the same event id and body
        for event_id in expected:
            copies = [r for r in got if r.event_id == event_id]
            assert len(copies) >= 2, "a 500 is tried again"
            assert {r.body for r in copies} == {copies[0].body}
            assert all(signed(r) and r.json()["id"] == event_id for r in copies)
        states = {d.event_id: d.state for d in list_deliveries(db, endpoint=name, limit=1000)}
        assert all(states[e] == "delivered" for e in expected)
    finally:
        client.close()
        db.dispose()

"""Outbound webhooks over real HTTP to a local receiver: the configuration, the signature,
the bodies, the sender on its own, and a real worker delivering a real run's events,
also to a receiver that is down for a while."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from relayq.relay import answer_output
from store import Database, migrate
from store.events import emit
from store.models import DeliveryRow, EventRow, utcnow
from store.webhooks import Event, RetryPolicy, delivery_log, list_deliveries
from tasks import DurableClient, Settings
from tasks.webhooks.sender import Endpoint, WebhookSender, render, sign, verify_signature
from tests.ports import free_port
from tests.webhook_receiver import Received, Receiver

from .conftest import Eventually, SpareWorkers

SECRET = "whsec-test-0123456789abcdef"
HOOK = {"name": "ops", "url": "https://hooks.example.com/relayq?key=k1", "secret": SECRET}


def settings_with(**env: str) -> Settings:
    return Settings.from_env({f"RELAYQ_{k.upper()}": v for k, v in env.items()})


def signed(r: Received) -> bool:
    h = r.headers
    return verify_signature(SECRET, h["X-Relayq-Timestamp"], r.body, h["X-Relayq-Signature"])


# -- configuration ----------------------------------------------------------------------------


def test_endpoints_come_from_one_json_variable():
    slack = {"name": "chat", "url": "https://hooks.slack.com/services/T/B/x", "format": "slack",
             "events": ["request.opened", "request.reminder"]}  # fmt: skip
    s = settings_with(webhooks=json.dumps([HOOK, slack]), public_url="https://relayq.example/")

    ops, chat = s.webhooks
    assert (ops.name, ops.url, ops.secret, ops.format, ops.events) == (
        "ops", HOOK["url"], SECRET, "json", None
    )  # fmt: skip
    assert (chat.format, chat.secret) == ("slack", "")
    assert chat.events == {"request.opened", "request.reminder"}
    assert s.public_url == "https://relayq.example"
    assert settings_with().webhooks == ()
    assert settings_with().public_url == "http://127.0.0.1:8000"


def test_endpoints_may_come_from_the_celery_configuration_with_the_secret_in_the_environment():
    conf = {
        "relayq_webhooks": [{"name": "ops", "url": HOOK["url"], "secret_env": "OPS_HOOK_KEY"}],
        "relayq_webhook_attempts": 5,
        "relayq_webhook_timeout": timedelta(seconds=3),
    }
    s = Settings.load(env={"OPS_HOOK_KEY": SECRET}, conf=conf)

    assert [e.secret for e in s.webhooks] == [SECRET]
    assert (s.webhook_attempts, s.webhook_timeout, s.webhook_concurrency) == (5, 3.0, 16)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("[{", "RELAYQ_WEBHOOKS must be a JSON list of endpoints"),
        ('{"name": "ops"}', "must be a list of endpoints"),
        ([{**HOOK, "name": "no spaces"}], "name must be"),
        ([{**HOOK, "url": "ftp://h/x?key=k1"}], r"\(ops\): url must be an http:// or https://"),
        ([{**HOOK, "secret": ""}], "needs a secret"),
        ([{**HOOK, "secret_env": "OPS_HOOK_KEY"}], "give secret or secret_env, not both"),
        ([{"name": "ops", "url": HOOK["url"], "secret_env": "UNSET"}], "'UNSET', which is not set"),
        ([{**HOOK, "format": "xml"}], "format must be 'json' or 'slack'"),
        ([{**HOOK, "events": ["run.started"]}], "unknown event type 'run.started'"),
        ([{**HOOK, "events": []}], "non-empty list"),
        ([{**HOOK, "headers": {}}], "unknown key 'headers'"),
        ([HOOK, HOOK], "names must be unique; ops repeat"),
    ],
)
def test_a_webhook_setting_that_cannot_work_is_refused_without_quoting_a_secret(value, says):
    raw = value if isinstance(value, str) else json.dumps(value)
    with pytest.raises(ValueError, match=says) as refused:
        settings_with(webhooks=raw)
    assert SECRET not in str(refused.value)
    assert "key=k1" not in str(refused.value)


def test_neither_the_settings_nor_an_endpoint_show_a_url_or_a_secret():
    s = settings_with(webhooks=json.dumps([HOOK]))
    for shown in (repr(s), repr(s.webhooks[0]), str(s.webhooks)):
        assert SECRET not in shown
        assert "key=k1" not in shown
    assert "hooks.example.com" in repr(s.webhooks[0])


# -- signature and bodies ---------------------------------------------------------------------


def test_a_signature_verifies_and_a_changed_body_or_an_old_timestamp_does_not():
    now = datetime(2030, 1, 1, tzinfo=utcnow().tzinfo)
    stamp = int(now.timestamp())
    body = b'{"id":"evt_1"}'
    header = sign(SECRET, stamp, body)

    assert header.startswith("sha256=")
    assert len(header) == 7 + 64
    assert verify_signature(SECRET, str(stamp), body, header, now=now)
    assert verify_signature(SECRET, stamp, body.decode(), f"sha256=0, {header}", now=now)
    assert not verify_signature(SECRET, stamp, body + b" ", header, now=now)
    assert not verify_signature("another secret", stamp, body, header, now=now)
    assert not verify_signature(SECRET, stamp + 1, body, header, now=now)
    assert not verify_signature(SECRET, "soon", body, header, now=now)
    later = now + timedelta(minutes=6)
    assert not verify_signature(SECRET, stamp, body, header, now=later)
    assert verify_signature(SECRET, stamp, body, header, now=later, tolerance=timedelta(hours=1))


EVENT = Event(
    id="evt_1",
    type="request.opened",
    run_id="run_1",
    request_id="req_1",
    payload={"runId": "run_1", "requestId": "req_1", "agent": "support", "tool": "refund"},
    created_at=datetime(2030, 1, 1, 12, 0, tzinfo=utcnow().tzinfo),
)


def test_the_json_body_is_the_event_its_id_type_time_and_data():
    endpoint = Endpoint(name="ops", url="https://h/x", secret=SECRET)

    body = json.loads(render(endpoint, EVENT, "https://relayq.example"))

    assert body == {
        "id": "evt_1",
        "type": "request.opened",
        "createdAt": "2030-01-01T12:00:00+00:00",
        "data": EVENT.payload,
    }


def test_the_slack_preset_is_one_line_with_a_link_to_the_requests_page():
    endpoint = Endpoint(name="chat", url="https://hooks.slack.com/x", format="slack")
    tricky = replace(EVENT, payload={**EVENT.payload, "agent": "<!channel> & co"})

    [text] = json.loads(render(endpoint, EVENT, "https://relayq.example")).values()
    [escaped] = json.loads(render(endpoint, tricky, "https://relayq.example")).values()

    assert text == (
        "Request waiting: `refund` for agent `support`, run `run_1`"
        " <https://relayq.example/requests/req_1|open request>"
    )
    assert "\n" not in text
    assert "agent `&lt;!channel&gt; &amp; co`" in escaped


def test_every_event_type_has_a_slack_line_and_a_run_event_has_no_request_link():
    endpoint = Endpoint(name="chat", url="https://hooks.slack.com/x", format="slack")
    failed = replace(
        EVENT,
        type="run.failed",
        request_id=None,
        payload={"agent": "support", "status": "failed", "error": "ModelError"},
    )
    decided = replace(
        EVENT,
        type="request.decided",
        payload={**EVENT.payload, "outcome": "approved", "decidedBy": "ann"},
    )

    def line(e: Event) -> str:
        return str(json.loads(render(endpoint, e, "http://x"))["text"])

    assert line(failed) == "Run failed: `run` for agent `support`, run `run_1`: ModelError"
    assert line(decided).startswith("Request decided: `refund` for agent `support`, run `run_1`: ")
    assert "approved by ann <http://x/requests/req_1|open request>" in line(decided)


# -- the sender on its own, against a real receiver -------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Database]:
    db = Database(f"sqlite:///{tmp_path / 'relayq.db'}")
    migrate(db)
    yield db
    db.dispose()


def opened(db: Database, **fields: Any) -> str:
    with db.transaction() as conn:
        return emit(conn, "request.opened", run_id="run_1", request_id="req_1", **fields)


async def test_the_sender_posts_each_event_signed_and_logs_the_delivery(
    store: Database, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger="httpx")
    with Receiver() as receiver:
        endpoint = Endpoint(name="ops", url=receiver.url("/hooks?key=k1"), secret=SECRET)
        sender = WebhookSender(store, [endpoint], public_url="https://relayq.example")
        event_id = opened(store, agent="support")

        async with sender.client():
            assert await sender.once() is False

        [got] = receiver.got()
    assert (got.path, got.status, got.event_id) == ("/hooks?key=k1", 200, event_id)
    assert got.headers["X-Relayq-Event-Type"] == "request.opened"
    assert got.headers["X-Relayq-Attempt"] == "1"
    assert got.headers["Content-Type"] == "application/json"
    assert signed(got)
    assert got.json()["id"] == event_id
    assert got.json()["data"]["agent"] == "support"
    [delivery] = list_deliveries(store)
    assert (delivery.state, delivery.attempts, delivery.last_status) == ("delivered", 1, 200)
    [line] = delivery_log(store, event_id=event_id)
    assert (line.endpoint, line.status, line.error) == ("ops", 200, None)
    # httpx logs each request: a webhook's URL (a Slack one is a secret) shows as its name
    assert "POST <webhook ops>" in caplog.text
    assert "key=k1" not in caplog.text


async def test_a_refusal_or_an_error_status_is_logged_and_tried_again(store: Database):
    # Given an endpoint nothing listens on
    port = free_port()
    endpoint = Endpoint(name="ops", url=f"http://127.0.0.1:{port}/hooks?key=k1", secret=SECRET)
    policy = RetryPolicy(base=timedelta(milliseconds=1))
    sender = WebhookSender(store, [endpoint], policy=policy)
    event_id = opened(store)

    async with sender.client():
        # When it is tried while down, then while answering 500, then while it is well
        await sender.once()
        with Receiver(port=port, fail_first=True) as receiver:
            for _ in range(2):
                await _after_backoff(store)
                await sender.once()
            got = receiver.got()

    # Then the log holds the three attempts, and the receiver saw the event twice, the same
    refused, error, ok = reversed(delivery_log(store, event_id=event_id))
    assert refused.status is None
    assert refused.error is not None
    assert refused.error.startswith("ConnectError")
    assert "key=k1" not in refused.error
    assert (error.status, error.error, ok.status, ok.error) == (500, "HTTP 500", 200, None)
    assert [(r.event_id, r.status) for r in got] == [(event_id, 500), (event_id, 200)]
    assert got[0].body == got[1].body
    assert [r.headers["X-Relayq-Attempt"] for r in got] == ["2", "3"]
    assert list_deliveries(store)[0].state == "delivered"


async def _after_backoff(db: Database) -> None:
    """Make the pending deliveries due now: the test does not wait out the backoff."""
    table = DeliveryRow.__table__  # type: ignore[attr-defined]
    with db.transaction() as conn:
        conn.execute(table.update().values(next_at=utcnow() - timedelta(seconds=1)))


# -- a real worker ----------------------------------------------------------------------------


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

        await eventually(tried_twice, what="two failed attempts of each event")
        assert all(a.error and a.status is None for a in delivery_log(db, endpoint=name))

        # And then it comes up, answering 500 to each event's first delivery
        with Receiver(port=port, fail_first=True) as receiver:

            def taken() -> set[str]:
                return {r.event_id for r in receiver.got() if r.status == 200} & expected

            await eventually(lambda: taken() == expected, what="every event, once up")
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

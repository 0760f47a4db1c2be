"""Outbound webhooks in one process: the configuration, the signature, the bodies, and the
sender on its own over real HTTP to a local receiver (`tasks.webhooks`). A real worker
delivering a real run's events: tests/durable/test_webhooks.py."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from store import Database, migrate
from store.events import emit
from store.models import DeliveryRow, utcnow
from store.webhooks import Event, RetryPolicy, delivery_log, list_deliveries
from tasks import Settings
from tasks.webhooks.sender import Endpoint, WebhookSender, render, sign, verify_signature
from tests.ports import free_port
from tests.tasks.webhook_signing import SECRET, signed
from tests.webhook_receiver import Receiver

HOOK = {"name": "ops", "url": "https://hooks.example.com/relayq?key=k1", "secret": SECRET}


def settings_with(**env: str) -> Settings:
    return Settings.from_env({f"RELAYQ_{k.upper()}": v for k, v in env.items()})


# -- configuration ----------------------------------------------------------------------------


def test_endpoints_come_from_one_json_variable():
    slack = {"name": "chat", "url": "https://hooks.slack.com/services/T/B/x", "format": "slack",
             "events": ["request.opened", "request.reminder"]}  # fmt: skip
    s = settings_with(webhooks=json.dumps([HOOK, slack]), public_url="https://relayq.example/")

    ops, chat = s.webhooks.endpoints
    assert (ops.name, ops.url, ops.secret, ops.format, ops.events) == (
        "ops", HOOK["url"], SECRET, "json", None
    )  # fmt: skip
    assert (chat.format, chat.secret) == ("slack", "")
    assert chat.events == {"request.opened", "request.reminder"}
    assert s.webhooks.public_url == "https://relayq.example"
    assert settings_with().webhooks.endpoints == ()
    assert settings_with().webhooks.public_url == "http://127.0.0.1:8000"


def test_endpoints_may_come_from_the_celery_configuration_with_the_secret_in_the_environment():
    conf = {
        "relayq_webhooks": [{"name": "ops", "url": HOOK["url"], "secret_env": "OPS_HOOK_KEY"}],
        "relayq_webhook_attempts": 5,
        "relayq_webhook_timeout": timedelta(seconds=3),
    }
    s = Settings.load(env={"OPS_HOOK_KEY": SECRET}, conf=conf)

    hooks = s.webhooks
    assert [e.secret for e in hooks.endpoints] == [SECRET]
    assert (hooks.attempts, hooks.timeout, hooks.concurrency) == (5, timedelta(seconds=3), 16)


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
    (endpoint,) = s.webhooks.endpoints
    for shown in (repr(s), repr(endpoint), str(s.webhooks)):
        assert SECRET not in shown
        assert "key=k1" not in shown
    assert "hooks.example.com" in repr(endpoint)


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

"""Issue 51: a malformed message never stops a worker (`workers.malformed`).

Each kind is pushed onto a live worker's queues as raw Redis list entries, as a buggy
or hostile publisher would. Five of them stopped the worker before ("Unrecoverable
error": raw bytes, an empty entry, JSON that is not an object, properties that are
not an object, a body that is not base64, headers that are not an object); others made
Celery log their body."""

from __future__ import annotations

import base64
import json
import uuid

from store import get_run
from store.outbox import ANSWER_QUEUE, ANSWER_TASK, MAINTENANCE_QUEUE, TURN_QUEUE, TURN_TASK
from tasks import DurableClient

from .conftest import Durable, Eventually, SpareWorkers

SECRET = "sk-malformed-" + uuid.uuid4().hex
"""In every message's content: never in the log."""


def entry(
    body: bytes,
    *,
    queue: str = TURN_QUEUE,
    headers: object = None,
    properties: object = None,
    content_type: str = "application/json",
    encoding: str = "utf-8",
) -> bytes:
    """A kombu Redis message as kombu's transport writes it, with parts replaced."""
    if headers is None:
        headers = {"task": TURN_TASK, "id": str(uuid.uuid4()), "secret": SECRET}
    if properties is None:
        properties = {
            "delivery_tag": str(uuid.uuid4()),
            "body_encoding": "base64",
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": 0,
        }
    return json.dumps(
        {
            "body": base64.b64encode(body).decode(),
            "content-encoding": encoding,
            "content-type": content_type,
            "headers": headers,
            "properties": properties,
        }
    ).encode()


ARGS = json.dumps([[SECRET, 1], {}, {"callbacks": None, "errbacks": None, "chain": None}])
KINDS: dict[str, bytes] = {
    "raw bytes": b"\xff\x00" + SECRET.encode(),
    "an empty entry": b"",
    "a JSON list": json.dumps([SECRET]).encode(),
    "a JSON string": json.dumps(SECRET).encode(),
    "a JSON number": b"42",
    "no properties": json.dumps({"body": SECRET, "headers": {}}).encode(),
    "properties a list": json.dumps({"body": SECRET, "headers": {}, "properties": [1]}).encode(),
    "a body not base64": entry(b"").replace(b'"body": ""', b'"body": "!%s%%"' % SECRET.encode()),
    "a body not JSON": entry(b"{" + SECRET.encode()),
    "a body of the wrong shape": entry(json.dumps({"secret": SECRET}).encode()),
    "pickle": entry(b"\x80\x04" + SECRET.encode(), content_type="application/x-python-serialize"),
    "an unknown content type": entry(SECRET.encode(), content_type="application/x-nope"),
    "headers without a task": entry(ARGS.encode(), headers={"id": SECRET}),
    "headers a list": entry(ARGS.encode(), headers=[SECRET]),
    "an unknown task": entry(ARGS.encode(), headers={"task": "nope", "id": SECRET}),
    "a turn's arguments wrong": entry(json.dumps([[1, 2, 3, 4, 5], {}, {}]).encode()),
    "an answer's arguments wrong": entry(
        json.dumps([[SECRET], {}, {}]).encode(),
        queue=ANSWER_QUEUE,
        headers={"task": ANSWER_TASK, "id": str(uuid.uuid4())},
    ),
    "a bad compression": entry(
        SECRET.encode(),
        headers={"task": TURN_TASK, "id": "c", "compression": "application/x-gzip"},
    ),
    "a priority not a number": entry(
        ARGS.encode(),
        properties={"delivery_tag": "t", "body_encoding": "base64", "priority": SECRET},
    ),
}


async def test_no_malformed_message_stops_a_worker_or_shows_its_content(
    durable: Durable,
    spare_workers: SpareWorkers,
    private_database: str,
    prompt: str,
    eventually: Eventually,
):
    # Given a worker on queues of its own
    spare = spare_workers.start(RELAYQ_DATABASE_URL=private_database)
    prefix = spare.env["RELAYQ_KEY_PREFIX"]
    redis = durable.broker.client()

    proc = spare.worker.proc
    assert proc is not None

    # When each kind of malformed message reaches each of its queues
    for name, raw in KINDS.items():
        for queue in (TURN_QUEUE, ANSWER_QUEUE, MAINTENANCE_QUEUE):
            redis.lpush(f"{prefix}{queue}", raw)
            assert proc.poll() is None, f"{name} on {queue} stopped the worker"

    # Then the worker takes every one of them off its queues, and still serves runs
    await eventually(
        lambda: not any(redis.llen(f"{prefix}{q}") for q in (TURN_QUEUE, ANSWER_QUEUE)),
        what="the queues read",
    )
    async with DurableClient(settings=spare.settings) as client:
        run_id = await client.start("two-step", prompt)
        result = await client.result(run_id, wait=True, timeout=60)
        assert result.status == "done", get_run(client.db, run_id).error
    assert proc.poll() is None
    # ... each dropped one logged as such, and none with its content
    log = spare.worker.logfile.read_text()
    assert log.count("could not be read as a task") >= len(KINDS) * 2, log[-3000:]
    assert "Unrecoverable error" not in log
    assert SECRET not in log

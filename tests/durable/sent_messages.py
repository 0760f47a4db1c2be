"""Every task message a test's processes send, as the broker was handed it: one JSON line
each in `sent.log` under `RELAYQ_TEST_LOG`, from Celery's `after_task_publish` signal.

The outbox keeps no message once it has had its effect (`store.outbox`), so the tests
that check where each turn went, and with what countdown, read this record instead.
An agents module imports it, so every worker (and the test process) that loads the
module records what it sends.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery.signals import after_task_publish, before_task_publish

__all__ = ["Sent", "sent_messages"]

LOG_NAME = "sent.log"


@dataclass(frozen=True)
class Sent:
    task: str
    task_id: str
    args: list[Any]
    queue: str
    countdown: bool
    """Sent to run later (an `eta`), as a retry or a wait for capacity is."""
    priority: int | None


def _log() -> Path | None:
    root = os.environ.get("RELAYQ_TEST_LOG")
    return None if root is None else Path(root)


_priorities: dict[str, int | None] = {}
"""Task id to the priority it is being published with: Celery hands the message's
properties to `before_task_publish` only, and a message is recorded once it went."""


@before_task_publish.connect
def _note_priority(
    headers: dict[str, Any] | None = None, properties: dict[str, Any] | None = None, **_: Any
) -> None:
    if headers is not None and _log() is not None:
        _priorities[str(headers.get("id"))] = (properties or {}).get("priority")


@after_task_publish.connect
def _record(
    sender: str | None = None,
    body: Any = None,
    headers: dict[str, Any] | None = None,
    routing_key: str | None = None,
    **_: Any,
) -> None:
    root = _log()
    if root is None or headers is None:
        return
    line = {
        "task": sender,
        "task_id": headers.get("id"),
        "args": list(body[0]) if body else [],
        "queue": routing_key,
        "countdown": headers.get("eta") is not None,
        "priority": _priorities.pop(str(headers.get("id")), None),
    }
    root.mkdir(parents=True, exist_ok=True)
    # One `write` on an O_APPEND file: whole lines, whichever process writes.
    fd = os.open(root / LOG_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def sent_messages(log: Path, *, run_ids: set[str] | None = None) -> list[Sent]:
    """What was sent, in order; with `run_ids`, only the turns of those runs."""
    path = log / LOG_NAME
    if not path.exists():
        return []
    found = [Sent(**json.loads(line)) for line in path.read_text().splitlines() if line]
    if run_ids is None:
        return found
    return [s for s in found if s.task == "relayq.run_turn" and s.args[0] in run_ids]

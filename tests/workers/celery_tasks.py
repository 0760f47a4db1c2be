"""relayq's Celery tasks, each with the queue the configuration routes it to
(tests/workers/test_config.py, and the running worker's in tests/durable/test_celery_config.py)."""

from __future__ import annotations

TASKS = {
    "relayq.run_turn": "relayq.turns",
    "relayq.submit_answer": "relayq.answers",
    "relayq.cancel_run": "relayq.maintenance",
    "relayq.sweep": "relayq.maintenance",
    "relayq.wake_runs": "relayq.maintenance",
}

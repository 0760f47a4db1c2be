"""The Celery app: `celery -A workers worker` runs relayq's tasks.

Configuration comes from the environment (see `tasks.settings` and
`workers.config`). With no `RELAYQ_BROKER_URL`, the worker and beat start
the embedded Redis before they connect.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.signals import beat_init, worker_init

from relayq.agents import load_agents
from tasks.settings import Settings
from workers.config import celery_config
from workers.embedded import ensure_embedded_redis

__all__ = ["app", "settings"]

settings = Settings.from_env()
app = Celery("relayq")
app.conf.update(celery_config(settings))


@worker_init.connect
def _prepare_worker(**_: Any) -> None:
    if settings.embedded_broker:
        ensure_embedded_redis(settings)
    # Fail at start, not at the first turn, when an agent module is broken.
    if settings.agents:
        load_agents(settings.agents)


@beat_init.connect
def _prepare_beat(**_: Any) -> None:
    if settings.embedded_broker:
        ensure_embedded_redis(settings)

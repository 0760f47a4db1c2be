"""What every process that talks to the store or the broker reads from the environment.

| variable | default | meaning |
|---|---|---|
| `RELAYQ_HOME` | `.relayq` | folder for the SQLite database and the embedded broker |
| `RELAYQ_DATABASE_URL` | SQLite at `$RELAYQ_HOME/relayq.db` | `postgresql+psycopg://...` |
| `RELAYQ_BROKER_URL` | the embedded Redis on `$RELAYQ_HOME/redis.sock` | the Celery broker |
| `RELAYQ_KEY_PREFIX` | `relayq:` | prefix of every broker key, so relayq can share a Redis |
| `RELAYQ_AGENTS` | (none) | comma-separated modules that define the agents |
| `RELAYQ_TURN_TIME_LIMIT` | `600` | seconds one turn may take before it is stopped |
| `RELAYQ_MODEL_RETRIES` | `5` | retries of a failing model call before the run fails |
| `RELAYQ_RETRY_BASE` | `1.0` | first retry's backoff in seconds; doubles, up to 60 |
| `RELAYQ_HEARTBEAT_EVERY` | `2` | seconds between a worker process's heartbeats |
| `RELAYQ_WORKER_TIMEOUT` | `10` | seconds without a heartbeat before a worker counts as dead |
| `RELAYQ_SWEEP_EVERY` | `5` | seconds between each worker's sweeps (beat sweeps as often) |
| `RELAYQ_REDELIVER_AFTER` | `10` | seconds before a lost message (effect overdue) is sent again |
| `RELAYQ_OUTBOX_GRACE` | `5` | seconds before a committed message never marked sent is sent again |
| `RELAYQ_VISIBILITY_TIMEOUT` | `3600` | the Redis broker's redelivery of unacknowledged messages |
| `RELAYQ_POOL` | `asyncio` | `asyncio` (many turns per process), `prefork`, `threads` |
| `RELAYQ_CONCURRENCY` | 500 (asyncio), CPUs (others) | turns one worker process runs at once |
| `RELAYQ_TASK_EVENTS` | `0` | `1`: task events from the start, not once Flower asks |
| `RELAYQ_MAX_ANSWER_BYTES` | `1048576` | largest answer (or prompt) taken, in bytes of JSON |
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from kombu import Exchange, Queue

from relayq import limits
from relayq._retry import MAX_DELAY
from store import Recovery
from store.outbox import (
    ANSWER_QUEUE,
    ANSWER_TASK,
    CANCEL_TASK,
    MAINTENANCE_QUEUE,
    SWEEP_TASK,
    TURN_QUEUE,
    TURN_TASK,
)

__all__ = ["MAX_COUNTDOWN", "QUEUES", "Settings"]


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if not raw:
        return float(default)
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, not {raw!r}") from None
    if value <= 0:
        raise ValueError(f"{name} must be more than 0 seconds, not {raw!r}")
    return value


MAX_COUNTDOWN = MAX_DELAY

# Separate queues: answers and maintenance never wait behind a backlog of
# turns, and each can get its own workers.
QUEUES = (TURN_QUEUE, ANSWER_QUEUE, MAINTENANCE_QUEUE)


@dataclass(frozen=True, kw_only=True)
class Settings:
    home: Path
    database_url: str
    broker_url: str
    embedded_broker: bool
    """True when no broker URL was configured: the embedded Redis serves."""
    key_prefix: str
    agents: str
    turn_time_limit: float
    model_retries: int
    retry_base: float
    pool: str
    concurrency: int | None
    heartbeat_every: float
    worker_timeout_seconds: float
    sweep_every: float
    redeliver_after_seconds: float
    outbox_grace_seconds: float
    visibility_timeout: float
    """Redis redelivers a message not acknowledged within it. Recovery does not wait
    for it (the sweeper acts within seconds); every time limit and retry countdown
    stays well below it, or the broker would hand a live turn's message out again."""
    task_events: bool
    """Send Celery task events from the start (Flower turns them on anyway while it runs)."""
    max_answer_bytes: int = limits.DEFAULT_MAX_ANSWER_BYTES
    """The largest answer (and prompt) taken, as compact UTF-8 JSON; see `relayq.limits`."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        home = Path(env.get("RELAYQ_HOME", ".relayq")).resolve()
        broker = env.get("RELAYQ_BROKER_URL", "")
        settings = cls(
            home=home,
            database_url=env.get("RELAYQ_DATABASE_URL") or f"sqlite:///{home / 'relayq.db'}",
            broker_url=broker or f"redis+socket://{home / 'redis.sock'}",
            embedded_broker=not broker,
            key_prefix=env.get("RELAYQ_KEY_PREFIX", "relayq:"),
            agents=env.get("RELAYQ_AGENTS", ""),
            turn_time_limit=float(env.get("RELAYQ_TURN_TIME_LIMIT", "600")),
            model_retries=int(env.get("RELAYQ_MODEL_RETRIES", "5")),
            retry_base=float(env.get("RELAYQ_RETRY_BASE", "1.0")),
            pool=env.get("RELAYQ_POOL", "asyncio"),
            concurrency=int(env["RELAYQ_CONCURRENCY"]) if env.get("RELAYQ_CONCURRENCY") else None,
            heartbeat_every=_seconds(env, "RELAYQ_HEARTBEAT_EVERY", 2),
            worker_timeout_seconds=_seconds(env, "RELAYQ_WORKER_TIMEOUT", 10),
            sweep_every=_seconds(env, "RELAYQ_SWEEP_EVERY", 5),
            redeliver_after_seconds=_seconds(env, "RELAYQ_REDELIVER_AFTER", 10),
            outbox_grace_seconds=_seconds(env, "RELAYQ_OUTBOX_GRACE", 5),
            visibility_timeout=_seconds(env, "RELAYQ_VISIBILITY_TIMEOUT", 3600),
            task_events=env.get("RELAYQ_TASK_EVENTS", "0").lower() in ("1", "true", "yes", "on"),
            max_answer_bytes=limits.max_answer_bytes(env),
        )
        settings._check()
        return settings

    def _check(self) -> None:
        if self.turn_time_limit + 120 >= self.visibility_timeout:
            raise ValueError(
                f"RELAYQ_TURN_TIME_LIMIT must stay well below the broker's visibility "
                f"timeout (RELAYQ_VISIBILITY_TIMEOUT, {self.visibility_timeout:.0f} s)"
            )
        if self.heartbeat_every * 2 > self.worker_timeout_seconds:
            raise ValueError(
                "RELAYQ_WORKER_TIMEOUT must be at least twice RELAYQ_HEARTBEAT_EVERY, "
                "or a live worker would be taken for dead"
            )

    @property
    def worker_timeout(self) -> timedelta:
        return timedelta(seconds=self.worker_timeout_seconds)

    def recovery(self) -> Recovery:
        """The sweeper's bounds, from these settings."""
        return Recovery(
            worker_timeout=self.worker_timeout,
            outbox_grace=timedelta(seconds=self.outbox_grace_seconds),
            redeliver_after=timedelta(seconds=self.redeliver_after_seconds),
        )

    @property
    def socket_path(self) -> Path:
        return self.home / "redis.sock"

    def broker_options(self) -> dict[str, Any]:
        """Celery settings every process needs to reach the broker the same way."""
        return {
            "broker_url": self.broker_url,
            "broker_connection_retry_on_startup": True,
            "broker_transport_options": {
                "visibility_timeout": self.visibility_timeout,
                "global_keyprefix": self.key_prefix,
            },
            # Each queue on its own exchange and key: a message reaches one queue only.
            "task_queues": tuple(Queue(q, Exchange(q), routing_key=q) for q in QUEUES),
            "task_default_queue": TURN_QUEUE,
            "task_routes": {
                TURN_TASK: {"queue": TURN_QUEUE},
                ANSWER_TASK: {"queue": ANSWER_QUEUE},
                CANCEL_TASK: {"queue": MAINTENANCE_QUEUE},
                SWEEP_TASK: {"queue": MAINTENANCE_QUEUE},
            },
            "task_serializer": "json",
            "accept_content": ["json"],
            "task_ignore_result": True,
            "result_backend": None,
        }

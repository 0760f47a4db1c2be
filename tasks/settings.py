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
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

__all__ = ["MAX_COUNTDOWN", "Settings"]

# Redis redelivers a message not acknowledged within the visibility timeout.
# Every time limit and every retry countdown stays well below it, or a slow
# turn would run twice.
VISIBILITY_TIMEOUT = 3600.0
MAX_COUNTDOWN = 300.0


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
        )
        if settings.turn_time_limit + 120 >= VISIBILITY_TIMEOUT:
            raise ValueError(
                f"RELAYQ_TURN_TIME_LIMIT must stay well below the broker's visibility "
                f"timeout ({VISIBILITY_TIMEOUT:.0f} s)"
            )
        return settings

    @property
    def lease(self) -> timedelta:
        """How long a claimed turn may hold its run before the sweeper presumes its worker dead."""
        return timedelta(seconds=self.turn_time_limit + 60)

    @property
    def socket_path(self) -> Path:
        return self.home / "redis.sock"

    def broker_options(self) -> dict[str, Any]:
        """Celery settings every process needs to reach the broker the same way."""
        return {
            "broker_url": self.broker_url,
            "broker_connection_retry_on_startup": True,
            "broker_transport_options": {
                "visibility_timeout": VISIBILITY_TIMEOUT,
                "global_keyprefix": self.key_prefix,
            },
            "task_serializer": "json",
            "accept_content": ["json"],
            "task_ignore_result": True,
            "result_backend": None,
        }

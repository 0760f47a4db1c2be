"""What the broker still holds: the oldest message waiting in each queue.

The sweeper needs it to tell a message that was lost (with a worker that
died holding it, or with a broker restarted empty) from one still waiting
its turn behind a backlog. Kombu's Redis transport keeps a queue as a list,
pushed at the head and popped at the tail, so the tail is the oldest.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable

import redis

from tasks.settings import Settings

__all__ = ["QueuePeek"]

log = logging.getLogger(__name__)


class QueuePeek:
    """Reads queue tails on the broker; None when the broker cannot say (down, or not Redis)."""

    def __init__(self, settings: Settings) -> None:
        self.prefix = settings.key_prefix
        url = settings.broker_url
        if url.startswith("redis+socket://"):
            url = "unix://" + url.removeprefix("redis+socket://")
        self._client = (
            redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
            if url.startswith(("redis://", "rediss://", "unix://"))
            else None
        )

    def oldest(self, queues: Iterable[str]) -> dict[str, str | None] | None:
        """Each queue's oldest waiting task id (None: the queue is empty)."""
        if self._client is None:
            return None
        try:
            with self._client.pipeline(transaction=False) as pipe:
                names = list(queues)
                for queue in names:
                    pipe.lindex(self.prefix + queue, -1)
                tails = pipe.execute()
        except redis.RedisError as exc:
            log.warning("could not look into the broker's queues: %s", type(exc).__name__)
            return None
        return {queue: _task_id(tail) for queue, tail in zip(names, tails, strict=True)}

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


def _task_id(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    try:
        return str(json.loads(raw)["headers"]["id"])
    except (ValueError, KeyError, TypeError):
        return "?"  # not a message of ours: it waits all the same

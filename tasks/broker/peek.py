"""What the broker still holds: the oldest message waiting in each queue.

The sweeper needs it to tell a message that was lost (with a worker that
died holding it, or with a broker restarted empty) from one still waiting
its turn behind a backlog. Kombu's Redis transport keeps a queue as a list
per priority level (`priority_lists`; a batch's turns wait at 6 and 9), each pushed
at the head and popped at the tail, so the tails are the oldest.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable

import redis

from tasks.broker.redis_clients import RedisBounds
from tasks.settings import PRIORITY_STEPS, Settings

__all__ = ["QueuePeek", "priority_lists"]

log = logging.getLogger(__name__)

_SEPARATOR = "\x06\x16"


def priority_lists(queue: str) -> list[str]:
    """The Redis lists (without the key prefix) holding `queue`'s messages, one a level:
    `queue` itself for 0, `queue` and kombu's separator and the level for the others."""
    return [queue if not p else f"{queue}{_SEPARATOR}{p}" for p in PRIORITY_STEPS]


class QueuePeek:
    """Reads queue tails on the broker; None when the broker cannot say (down, or not Redis)."""

    def __init__(self, settings: Settings) -> None:
        self.prefix = settings.key_prefix
        url = settings.redis_url
        self._client = (
            None
            if url is None
            else redis.Redis.from_url(url, **RedisBounds.of(settings).options(url))
        )

    def oldest(self, queues: Iterable[str]) -> dict[str, list[str]] | None:
        """Each queue's oldest waiting task id at each priority holding any (none: the
        queue is empty)."""
        if self._client is None:
            return None
        names = list(queues)
        per = len(PRIORITY_STEPS)
        try:
            with self._client.pipeline(transaction=False) as pipe:
                for queue in names:
                    for key in priority_lists(queue):
                        pipe.lindex(self.prefix + key, -1)
                tails = pipe.execute()
        except redis.RedisError as exc:
            log.warning("could not look into the broker's queues: %s", type(exc).__name__)
            return None
        return {
            queue: [_task_id(tail) for tail in tails[n * per : (n + 1) * per] if tail is not None]
            for n, queue in enumerate(names)
        }

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


def _task_id(raw: bytes) -> str:
    try:
        return str(json.loads(raw)["headers"]["id"])
    except (ValueError, KeyError, TypeError):
        return "?"  # not a message of ours: it waits all the same

"""The consumer's channels (`workers.doorbell`) on a real Redis: turn and answer messages
are held in the worker's memory only, the rest in kombu's `unacked` hash; whatever the
worker gives back returns to its queue."""

from __future__ import annotations

from kombu import Connection

from store.outbox import ANSWER_TASK, SWEEP_TASK, TURN_TASK
from workers.doorbell import doorbell_for

from .conftest import Broker

QUEUE = "relayq.doorbell-test"


def test_a_worker_notes_in_redis_only_the_messages_the_sweeper_cannot_send_again(
    broker: Broker,
):
    prefix = broker.new_prefix()
    redis = broker.client()
    with Connection(broker.url, transport_options={"global_keyprefix": prefix}) as conn:
        doorbell_for(conn)
        queue = conn.SimpleQueue(QUEUE)
        for task in (TURN_TASK, ANSWER_TASK, SWEEP_TASK):
            queue.put({"task": task}, headers={"task": task})

        # Taken, none acknowledged: only the sweep is noted in Redis
        taken = {m.headers["task"]: m for m in (queue.get(timeout=5) for _ in range(3))}
        noted = redis.hvals(prefix + "unacked")
        assert [SWEEP_TASK.encode() in n for n in noted] == [True]
        assert redis.llen(prefix + QUEUE) == 0

        # A turn given back (rejected to be requeued) is on its queue again, from memory;
        # the answer acknowledged is gone
        taken[TURN_TASK].reject(requeue=True)
        taken[ANSWER_TASK].ack()
        assert redis.llen(prefix + QUEUE) == 1
        again = queue.get(timeout=5)
        assert again.headers["task"] == TURN_TASK

        # When the channel closes (a warm shutdown), the turn it holds goes back from
        # memory, and the sweep from kombu's hash
        queue.close()
    waiting = redis.lrange(prefix + QUEUE, 0, -1)
    assert sorted(TURN_TASK.encode() in w for w in waiting) == [False, True]
    assert redis.hlen(prefix + "unacked") == 0
    redis.close()

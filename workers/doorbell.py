"""Turn and answer messages taken from Redis without kombu's acknowledgement bookkeeping.

Why: kombu's Redis transport emulates acknowledgements. Each delivered message is
written to an `unacked` hash and its index (a MULTI/EXEC on delivery, another on the
ack), so that a message whose worker died goes back to its queue after the
visibility timeout (an hour). For turns and answers relayq does not need it: the
store is the source of truth, and the sweeper already takes over a dead worker's
claims and sends again a queued run's turn, or an accepted answer's task, whose
message has left its queue (`store.maintenance`), within seconds rather than the
hour. For those messages the broker is a doorbell: what it delivers is kept in the
worker's memory only, which still counts against the prefetch limit, and what the
worker gives back (a message rejected to be requeued; at a warm shutdown, those it
reserved and never started) goes back to its queue from there. The maintenance
queue's messages (sweeps, cancels, wake-ups) keep kombu's bookkeeping.

Where: the consumer's connection (`workers.app.Consumer`) makes its channels with
`Channel`; every other connection keeps kombu's.
"""

from __future__ import annotations

from typing import Any, cast

from kombu.transport import redis, virtual
from kombu.transport.virtual import Empty

from store.outbox import ANSWER_TASK, TURN_TASK
from workers.malformed import malformed_message

__all__ = ["RESENT_BY_THE_SWEEPER", "Channel", "doorbell_for"]

RESENT_BY_THE_SWEEPER = frozenset({TURN_TASK, ANSWER_TASK})
"""The tasks whose lost messages the sweeper sends again from the store."""


class QoS(redis.QoS):
    """kombu's Redis QoS, with the doorbell's messages held in memory only.

    kombu internal: `virtual.QoS` keeps the delivered messages (`_delivered`, by
    delivery tag) and the acknowledged ones (`_dirty`) in memory, and counts them
    against the prefetch limit; `redis.QoS` adds the hash and index in Redis.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rung: set[str] = set()
        """Delivery tags of messages held in memory only, not yet acknowledged."""

    def append(self, message: Any, delivery_tag: str) -> None:
        if message.headers.get("task") in RESENT_BY_THE_SWEEPER:
            self._rung.add(delivery_tag)
            virtual.QoS.append(self, message, delivery_tag)
        else:
            super().append(message, delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        if delivery_tag in self._rung:
            self._rung.discard(delivery_tag)
            virtual.QoS.ack(self, delivery_tag)
        else:
            super().ack(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if delivery_tag in self._rung:
            if requeue:
                self._put_back(delivery_tag, leftmost=True)
            self._rung.discard(delivery_tag)
            virtual.QoS.ack(self, delivery_tag)
        else:
            super().reject(delivery_tag, requeue=requeue)

    def restore_unacked(self, client: Any = None) -> None:
        # At a warm shutdown or a channel's close: what the worker took and never
        # finished goes back to its queue, from memory or from kombu's hash.
        self._flush()
        with self.channel.conn_or_acquire(client) as conn:
            for tag in list(self._held):
                if tag in self._rung:
                    self._put_back(tag, client=conn)
                else:
                    self.restore_by_tag(tag, client=conn)
        self._rung.clear()
        self._held.clear()

    @property
    def _held(self) -> dict[str, Any]:
        # kombu declares `_delivered` None on the class, and sets it in `__init__`.
        return cast("dict[str, Any]", self._delivered)

    def _put_back(self, delivery_tag: str, *, client: Any = None, leftmost: bool = False) -> None:
        message = self._held[delivery_tag]
        delivery = message.delivery_info
        with self.channel.conn_or_acquire(client) as conn, conn.pipeline() as pipe:
            # kombu internal: how the Redis channel puts a message back on its queue,
            # at its priority, marked redelivered.
            self.channel._do_restore_message(
                message._raw, delivery["exchange"], delivery["routing_key"], pipe, leftmost
            )
            pipe.execute()


class Channel(redis.Channel):
    QoS = QoS

    def _brpop_read(self, **options: Any) -> bool:
        # kombu internal: the channel's read of one message it popped from a queue, then
        # decoded and handed on to the consumer; what fails there, other than the
        # connection, fails in the hub and stops the worker (celery#4308, #7975).
        try:
            return bool(super()._brpop_read(**options))
        except (Empty, *self.connection_errors):
            raise
        except Exception as exc:
            # The message is gone from its queue and is not kept: one that was a turn's or
            # an answer's doorbell is rung again by the sweeper, from the store.
            malformed_message("a queue", exc)
            return True


def doorbell_for(connection: Any) -> None:
    """Give a consumer's kombu `Connection` the doorbell's channels if it uses kombu's
    Redis transport; must come before its first channel is made."""
    # kombu internal: a transport makes its channels with `self.Channel`; the
    # connection keeps its transport until it is closed, and Celery makes a new
    # connection (through `Consumer.ensure_connected`) for every reconnection. The
    # transport class itself stays kombu's, so the connection's URL reads as before.
    transport = connection.transport
    if type(transport) is redis.Transport:
        transport.Channel = Channel

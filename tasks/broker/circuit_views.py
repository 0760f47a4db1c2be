"""The provider circuits not closed, as Redis holds them (`tasks.broker.redis_circuit`), read for
people: /metrics (`tasks.observability.gauges`) and `relayq batch status`."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

import redis

from relayq.circuit import CircuitState
from tasks.broker.redis_circuit import decoded
from tasks.broker.redis_clients import RedisBounds
from tasks.settings import Settings

__all__ = ["CircuitView", "batch_waits", "read_circuits", "since_text"]

# The logger of all of the provider circuit (`tasks.broker.circuit`), where its lines always were.
log = logging.getLogger("tasks.broker.circuit")


@dataclass(frozen=True, kw_only=True)
class CircuitView:
    """One circuit that is not closed, as Redis holds it."""

    provider: str
    """The provider's label, `host/model`."""
    host: str
    model: str
    state: CircuitState
    opened_at: float
    """Unix seconds."""
    kind: str
    waiting: int
    """Runs waiting for it."""
    probes: int
    batch_since: float | None = None
    """When the asked-for batch's first run began to wait for it (None: none waits)."""


def read_circuits(
    client: redis.Redis, prefix: str, *, batch_id: str | None = None
) -> list[CircuitView]:
    """Every circuit not closed under `prefix` (blocking; raises redis.RedisError)."""
    names = sorted(decoded(n) for n in cast(set[bytes], client.smembers(f"{prefix}circuits")))
    with client.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.hmget(name, "state", "opened", "label", "host", "model", "kind", "probes")
            pipe.hlen(f"{name}:waiting")
            pipe.hget(f"{name}:batches", batch_id or "")
        found = pipe.execute()
    views = []
    for n in range(len(names)):
        fields, waiting, batch_since = found[3 * n : 3 * n + 3]
        state, opened, label, host, model, kind, probes = (decoded(f) for f in fields)
        if not state:
            continue  # closed (or expired) since the registry was read
        views.append(
            CircuitView(
                provider=label,
                host=host,
                model=model,
                state=cast(CircuitState, state),
                opened_at=int(opened or 0) / 1e6,
                kind=kind,
                waiting=int(waiting),
                probes=int(probes or 0),
                batch_since=int(batch_since) / 1e6 if batch_id and batch_since else None,
            )
        )
    return views


def batch_waits(settings: Settings, batch_id: str) -> list[CircuitView]:
    """The circuits not closed that runs of batch `batch_id` wait for (blocking); none when
    the broker is not Redis or does not answer."""
    url = settings.redis_url
    if url is None:
        return []
    client = redis.Redis.from_url(url, **RedisBounds.of(settings).options(url))
    try:
        views = read_circuits(client, settings.key_prefix, batch_id=batch_id)
    except (redis.RedisError, OSError) as exc:
        log.warning("could not read the provider circuits: %s", type(exc).__name__)
        return []
    finally:
        client.close()
    return [view for view in views if view.batch_since is not None]


def since_text(moment: float) -> str:
    """A circuit's moment for people: UTC, to the second."""
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")

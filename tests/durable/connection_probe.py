"""A process of its own that opens and closes relayq's Redis clients many ways, and says
what it holds before and after: `python -m tests.durable.connection_probe SPEC.json`.

SPEC: {"env": {...}, "done_run": id, "agent": name, "restart_port": port, "folder": dir}.
It prints one JSON line: its open sockets and its named Redis connections before and
after, and every ResourceWarning or unraisable error it met (tests/durable/
test_redis_connections.py reads it).

1. 1,000 `DurableClient`s with pushed waiting, 100 on each of 10 event loops: each waits
   on a finished run and is closed, a third through `async with`, a third by `close()`
   on its loop, a third once its subscription is confirmed.
2. One client used from 200 successive event loops, each waiting on a run a worker ends.
3. A limiter and a circuit on a Redis of their own, through a kill and a restart empty;
   one loop ends without closing them, the next closes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import sys
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

import redis

from relayq.ratelimit import ProviderLimits
from tasks import DurableClient, Settings
from tasks.broker.limiter import RedisLimiter
from tasks.broker.redis_circuit import RedisCircuit
from tests.brokers import PrivateRedis

CLIENTS, LOOPS, REUSED = 1000, 10, 200

met: list[str] = []
phase = "setup"


def _note_warning(message: Any, category: Any, *args: Any, **kwargs: Any) -> None:
    met.append(f"{phase}: {category.__name__}: {message}")


def _note_unraisable(unraisable: Any) -> None:
    met.append(
        f"{phase}: unraisable: {unraisable.exc_type.__name__}: {unraisable.exc_value}"
        f" in {unraisable.object!r}"
    )


def sockets() -> int:
    """This process's open sockets (a descriptor leading to `socket:[inode]`)."""
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, gone by now
            found += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return found


def named_connections(url: str) -> int:
    """This process's connections to the Redis at `url`, as its CLIENT LIST names them."""
    with redis.Redis.from_url(url) as admin:
        mine = f"-{os.getpid()}"
        return sum(1 for c in admin.client_list() if str(c.get("name", "")).endswith(mine))


async def _subscribed(client: redis.Redis, channel: str) -> None:
    # Redis's word, asked again while the client's own subscriber runs on this loop.
    while client.pubsub_numsub(channel)[0][1] < 1:  # noqa: ASYNC110
        await asyncio.sleep(0.005)


async def many_clients(settings: Settings, done_run: str, admin: redis.Redis, k: int) -> None:
    channel = f"{settings.key_prefix}runs"
    for i in range(CLIENTS // LOOPS):
        how = (k + i) % 3
        if how == 0:
            async with DurableClient(settings=settings) as client:
                await client.settled(done_run, timeout=10)
            continue
        client = DurableClient(settings=settings)
        await client.settled(done_run, timeout=10)
        if how == 2:
            await _subscribed(admin, channel)
        client.close()  # on its loop: the loop's end finishes the close


def reused_client(settings: Settings, agent: str, *, runs: int = REUSED) -> None:
    client = DurableClient(settings=settings)
    try:
        for i in range(runs):
            res = asyncio.run(client.run(agent, f"probe {uuid.uuid4().hex} {i}", timeout=30))
            assert res.status == "done", res
    finally:
        client.close()


async def limiter_and_circuit(limiter: RedisLimiter, circuit: RedisCircuit, close: bool) -> None:
    limits = ProviderLimits(key=f"probe-{uuid.uuid4().hex[:6]}", label="probe", max_in_flight=4)
    for _ in range(5):
        permit = await limiter.acquire(limits, prompt_tokens=10, max_wait=1)
        await limiter.release(permit, used=None)
        ticket = await circuit.admit(limits)
        await circuit.answered(ticket)
    if close:
        await limiter.aclose()
        await circuit.aclose()


def through_a_restart(folder: Path, port: int) -> None:
    with PrivateRedis(folder, port=port) as broker:
        limiter = RedisLimiter(broker.url, prefix="probe:", retry_unavailable=0.05)
        circuit = RedisCircuit(broker.url, prefix="probe:", probe_every=1, retry_unavailable=0.05)
        asyncio.run(limiter_and_circuit(limiter, circuit, close=False))
        broker.kill()
        asyncio.run(limiter_and_circuit(limiter, circuit, close=False))  # unreachable
        broker.restart_empty()
        time.sleep(0.1)  # past retry_unavailable: both try Redis again
        asyncio.run(limiter_and_circuit(limiter, circuit, close=False))
        asyncio.run(limiter_and_circuit(limiter, circuit, close=True))
        assert named_connections(broker.url) == 0, "connections left on the restarted Redis"


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    warnings.simplefilter("always")
    warnings.showwarning = _note_warning
    sys.unraisablehook = _note_unraisable
    settings = Settings.from_env(spec["env"])
    url = settings.broker_url.replace("redis+socket://", "unix://")
    admin = redis.Redis.from_url(url)
    admin.ping()

    # What the probe holds once its own parts are up: the admin connection, and the broker
    # connections kombu keeps for every sender of the process (its pools are process-wide,
    # shared by every Celery app on one broker, and bounded): one run warms them.
    reused_client(settings, spec["agent"], runs=1)
    gc.collect()
    before = {"sockets": sockets(), "redis": named_connections(url)}
    global phase
    phase = "many clients"
    for k in range(LOOPS):
        asyncio.run(many_clients(settings, spec["done_run"], admin, k))
    gc.collect()
    phase = "one client, many loops"
    reused_client(settings, spec["agent"])
    gc.collect()
    phase = "a broker restart"
    through_a_restart(Path(spec["folder"]), spec["restart_port"])
    gc.collect()
    after = {"sockets": sockets(), "redis": named_connections(url)}
    admin.close()
    print(json.dumps({"before": before, "after": after, "met": met}))


if __name__ == "__main__":
    main()

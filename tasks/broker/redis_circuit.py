"""Provider circuits shared by every worker: `RedisCircuit`, on the broker's Redis.

Each provider whose circuit is not closed has, under the settings' key prefix:

    {prefix}circuit:{<key>}          hash: state (open, half_open), opened (when, in
                                     microseconds of Redis's TIME), kind (the last outage
                                     error's), probe_at (the next probe's moment), probe
                                     and probe_until (the probe's holder and its lease),
                                     probes (made so far), prober and prober_at (the
                                     run that comes back for the next probe, last seen),
                                     label, host, model
    {prefix}circuit:{<key>}:waiting  hash: run id -> when it began to wait, this outage
    {prefix}circuit:{<key>}:batches  hash: batch id -> when its first run began to wait
    {prefix}circuits                 set: the circuits not closed (for /metrics and
                                     `relayq batch status`)

A closed circuit has no keys. One Lua script makes each change, so two workers
never both open a circuit or both probe it: the first outage error opens it (its
turn becomes the prober: it comes back for the first probe after
RELAYQ_PROVIDER_PROBE_EVERY), a call past `probe_at` takes the probe with a lease
(a probe whose worker died frees it when the lease runs out), and an answer
closes it, deleting every key and handing the waiting runs to its `wake` (a
`relayq.wake_runs` message: `tasks.broker.circuit`), so they go again at once instead
of at the end of their countdowns.

A process trusts what it last read of a circuit for at most `REFRESH` seconds: a
call on a closed circuit costs no round trip, a turn kept back by an open one
none either until its probe is due. When Redis cannot be reached the circuit is
left out (a warning): outage errors spend the turn's retries as they would
without it, and no turn waits on a broker outage.

The process's circuit, its hooks and its waker are `tasks.broker.circuit`'s; the circuits as
read for people (/metrics, `relayq batch status`) are `tasks.broker.circuit_views`'.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import redis
import redis.asyncio as aioredis

from relayq.circuit import (
    Circuit,
    CircuitChange,
    CircuitHooks,
    CircuitState,
    OutageKind,
    ProviderDown,
    Ticket,
    Wait,
)
from relayq.hooking import Emitter
from relayq.ratelimit import ProviderLimits
from tasks.broker.redis_clients import DEFAULT_BOUNDS, FailOpen, RedisBounds, redis_pool

__all__ = ["REFRESH", "RedisCircuit", "Wake", "decoded"]

# The logger of all of the provider circuit (`tasks.broker.circuit`), where its lines always were.
log = logging.getLogger("tasks.broker.circuit")

REFRESH = 1.0
"""Seconds a process trusts the circuit state it last read, before it asks Redis again."""
_TTL_MS = 86_400_000
"""A circuit's keys outlive their last write by a day: a whole fleet gone leaves none for
good (its next probe, or this, ends it)."""

# KEYS: circuit, waiting, batches, registry. ARGV: holder, lease (us).
# Returns {verdict (closed, open, half_open, probe), opened (us), wait (us), kind}.
_CHECK = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local st = redis.call('HMGET', KEYS[1], 'state', 'opened', 'probe_at', 'probe_until', 'kind')
if not st[1] then return {'closed', 0, 0, ''} end
local opened, probe_at = tonumber(st[2]), tonumber(st[3]) or 0
local held = tonumber(st[4]) or 0
if st[1] == 'half_open' and held > now then
  return {'half_open', opened, math.floor(held - now), st[5]}
end
if probe_at > now then return {'open', opened, math.floor(probe_at - now), st[5]} end
redis.call('HSET', KEYS[1], 'state', 'half_open', 'probe', ARGV[1],
  'probe_until', string.format('%.0f', now + tonumber(ARGV[2])))
redis.call('HINCRBY', KEYS[1], 'probes', 1)
return {'probe', opened, 0, st[5]}
"""

# KEYS: as above. ARGV: holder, kind, next probe in (us), label, host, model, ttl (ms).
# Returns {verdict (opened, reopened, open), opened (us), next probe in (us)}.
_FAILED = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local st = redis.call('HMGET', KEYS[1], 'state', 'opened', 'probe', 'probe_at')
local probe_at = now + tonumber(ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[7])
if not st[1] then
  redis.call('HSET', KEYS[1], 'state', 'open', 'opened', string.format('%.0f', now),
    'kind', ARGV[2], 'probe_at', string.format('%.0f', probe_at), 'probes', 0,
    'label', ARGV[4], 'host', ARGV[5], 'model', ARGV[6])
  redis.call('PEXPIRE', KEYS[1], ARGV[7])
  redis.call('SADD', KEYS[4], KEYS[1])
  return {'opened', now, math.floor(probe_at - now)}
end
redis.call('HSET', KEYS[1], 'kind', ARGV[2])
if st[1] == 'half_open' and st[3] == ARGV[1] then
  redis.call('HSET', KEYS[1], 'state', 'open', 'probe_at', string.format('%.0f', probe_at))
  redis.call('HDEL', KEYS[1], 'probe', 'probe_until')
  return {'reopened', tonumber(st[2]), math.floor(probe_at - now)}
end
return {'open', tonumber(st[2]), math.max(0, math.floor((tonumber(st[4]) or now) - now))}
"""

# KEYS: as above. Returns {0} (it was closed) or {1, opened (us), {waiting run ids}}.
_ANSWERED = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
local opened = tonumber(redis.call('HGET', KEYS[1], 'opened')) or 0
local runs = redis.call('HKEYS', KEYS[2])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.call('SREM', KEYS[4], KEYS[1])
return {1, opened, runs}
"""

# KEYS: as above. ARGV: holder. The probe's holder gives it up: the next caller probes.
_ABANDON = """
if redis.call('HGET', KEYS[1], 'probe') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'state', 'open')
redis.call('HDEL', KEYS[1], 'probe', 'probe_until')
return 1
"""

# KEYS: as above. ARGV: run id, batch id (or ""), ttl (ms), probing (1: told to probe),
# stale (us). The run keeps the moment it began to wait, and is the prober when it was told
# to probe, was the prober, or the prober has not been seen for `stale`. Returns {since
# (us), prober (0, 1)}, or nil when the circuit is closed.
_WAIT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('HSETNX', KEYS[2], ARGV[1], string.format('%.0f', now))
redis.call('PEXPIRE', KEYS[2], ARGV[3])
if ARGV[2] ~= '' then
  redis.call('HSETNX', KEYS[3], ARGV[2], string.format('%.0f', now))
  redis.call('PEXPIRE', KEYS[3], ARGV[3])
end
local st = redis.call('HMGET', KEYS[1], 'prober', 'prober_at')
local prober = 0
if ARGV[4] == '1' or st[1] == ARGV[1] or not st[1]
   or now - (tonumber(st[2]) or 0) > tonumber(ARGV[5]) then
  redis.call('HSET', KEYS[1], 'prober', ARGV[1], 'prober_at', string.format('%.0f', now))
  prober = 1
end
return {tonumber(redis.call('HGET', KEYS[2], ARGV[1])), prober}
"""


@dataclass
class _Seen:
    """What this process last read of one circuit."""

    state: CircuitState
    recheck: float
    """When to ask Redis again (time.monotonic())."""
    opened_at: float = 0.0
    kind: OutageKind | None = None


@dataclass
class _Conn:
    """What one event loop uses: its own Redis pool (a pool cannot cross loops)."""

    client: aioredis.Redis
    scripts: dict[str, Any] = field(default_factory=dict)


Wake = Callable[[list[str]], Awaitable[None]]
"""Sends the runs that waited on a circuit just closed on their way again."""


class RedisCircuit(Circuit):
    """Provider circuits kept in Redis, shared by every process that uses the same keys.

    RedisCircuit("redis://127.0.0.1:6379/0", prefix="relayq:", probe_every=5.0)
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str,
        probe_every: float,
        hooks: Iterable[CircuitHooks] | Emitter[CircuitHooks] = (),
        wake: Wake | None = None,
        retry_unavailable: float = 5.0,
        bounds: RedisBounds = DEFAULT_BOUNDS,
    ) -> None:
        super().__init__(hooks)
        self.url = url
        self.bounds = bounds
        self.prefix = prefix
        self.probe_every = probe_every
        """Seconds between probes of an open circuit (longer when the provider asks)."""
        self.wake = wake
        self._seen: dict[str, _Seen] = {}
        self._redis = FailOpen(
            self._open, client=lambda conn: conn.client, retry_after=retry_unavailable
        )
        """The circuit is left out for `retry_unavailable` seconds after Redis failed."""

    def __repr__(self) -> str:
        return f"RedisCircuit(prefix={self.prefix!r})"  # never the URL: it may hold a password

    def keys(self, key: str) -> list[str]:
        """Circuit `key`'s hash, its waiting runs and batches, and the registry."""
        base = f"{self.prefix}circuit:{{{key}}}"
        return [base, f"{base}:waiting", f"{base}:batches", f"{self.prefix}circuits"]

    async def aclose(self) -> None:
        """Close this event loop's connections."""
        await self._redis.aclose()

    def _open(self) -> _Conn:
        return _Conn(redis_pool(self.url, owner="circuit", max_connections=8, bounds=self.bounds))

    async def _run(self, script: str, key: str, *args: str | int) -> Any:
        """Run `script` on circuit `key`; raises redis.RedisError or OSError."""
        conn = await self._redis.get()
        registered = conn.scripts.get(script)
        if registered is None:
            registered = conn.scripts[script] = conn.client.register_script(script)
        return await registered(keys=self.keys(key), args=list(args))

    def _unavailable(self, limits: ProviderLimits | None, exc: BaseException) -> None:
        self._redis.failed()
        if self._redis.say_now():
            what = limits.label if limits is not None else "a provider"
            log.warning(
                "provider circuits unavailable (%s): %s's outage errors spend retries",
                type(exc).__name__,
                what,
            )

    # -- seen by this process ------------------------------------------------------------------

    def _see(
        self,
        limits: ProviderLimits,
        seen: _Seen,
        *,
        ours: bool = False,
        woken: int = 0,
        probe_failed: bool = False,
    ) -> None:
        """Keep what was read of a circuit; tell the hooks of what changed for this process:
        each change it made (`ours`), and an opening or a closing made elsewhere."""
        before = self._seen.get(limits.key)
        if before is not None and not seen.opened_at:
            seen.opened_at = before.opened_at  # a closing read elsewhere: since when it was open
        self._seen[limits.key] = seen
        was_closed = before is None or before.state == "closed"
        if ours or was_closed != (seen.state == "closed"):
            state: CircuitState = "open" if seen.state == "half_open" and not ours else seen.state
            self.hooks.emit_now(
                CircuitChange(
                    **limits.names(),
                    state=state,
                    kind=seen.kind,
                    opened_at=seen.opened_at or None,
                    woken=woken,
                    probe_failed=probe_failed,
                )
            )

    def _trust(self, wait: float) -> float:
        """Seconds to trust a circuit read as not closed, whose next change is `wait` away
        (0: unknown): a probe made elsewhere may close it sooner."""
        return min(REFRESH, self.probe_every, wait or REFRESH)

    def _down(self, limits: ProviderLimits, seen: _Seen, retry_in: float) -> ProviderDown:
        return ProviderDown(
            limits.label, limits.key, seen.opened_at, max(0.0, retry_in), kind=seen.kind
        )

    # -- the steps of a call -------------------------------------------------------------------

    async def admit(self, limits: ProviderLimits) -> Ticket:
        now = time.monotonic()
        seen = self._seen.get(limits.key)
        if seen is not None and now < seen.recheck:
            if seen.state == "closed":
                return Ticket(limits=limits)
            raise self._down(limits, seen, seen.recheck - now)
        if self._redis.down:
            return Ticket(limits=limits)
        holder = uuid.uuid4().hex
        try:
            reply = await self._run(_CHECK, limits.key, holder, int(limits.lease * 1e6))
        except (redis.RedisError, OSError, ValueError) as exc:
            self._unavailable(limits, exc)
            return Ticket(limits=limits)
        verdict, opened, wait, kind = cast(list[Any], reply)
        verdict = decoded(verdict)
        kind = cast(OutageKind | None, decoded(kind) or None)
        state = cast(CircuitState, "half_open" if verdict == "probe" else verdict)
        seen = _Seen(state, now + self._trust(int(wait) / 1e6), int(opened) / 1e6, kind)
        self._see(limits, seen, ours=verdict == "probe")
        if verdict == "closed":
            return Ticket(limits=limits)
        if verdict == "probe":
            return Ticket(limits=limits, id=holder, probe=True)
        raise self._down(limits, seen, int(wait) / 1e6)

    async def failed(
        self, ticket: Ticket, kind: OutageKind, error: str, *, retry_after: float | None = None
    ) -> ProviderDown | None:
        limits = ticket.limits
        if self._redis.down:
            return None
        probe_in = max(self.probe_every, retry_after or 0.0)
        try:
            reply = await self._run(
                _FAILED,
                limits.key,
                ticket.id,
                kind,
                int(probe_in * 1e6),
                limits.label,
                limits.host,
                limits.model,
                _TTL_MS,
            )
        except (redis.RedisError, OSError, ValueError) as exc:
            self._unavailable(limits, exc)
            return None
        verdict, opened, wait = cast(list[Any], reply)
        ours = decoded(verdict) in ("opened", "reopened")
        reopened = decoded(verdict) == "reopened"
        retry_in = int(wait) / 1e6
        seen = _Seen("open", time.monotonic() + self._trust(retry_in), int(opened) / 1e6, kind)
        self._see(limits, seen, ours=ours, probe_failed=reopened)
        return ProviderDown(
            limits.label,
            limits.key,
            seen.opened_at,
            retry_in,
            probing=ours,
            called=True,
            kind=kind,
            error=error,
        )

    async def answered(self, ticket: Ticket) -> None:
        limits = ticket.limits
        seen = self._seen.get(limits.key)
        if not ticket.probe and (seen is None or seen.state == "closed"):
            return  # closed as far as this process knows: no round trip
        try:
            reply = cast(list[Any], await self._run(_ANSWERED, limits.key))
        except (redis.RedisError, OSError, ValueError) as exc:
            self._unavailable(limits, exc)
            return
        runs = [decoded(r) for r in reply[2]] if reply[0] else []
        opened = int(reply[1]) / 1e6 if reply[0] else 0.0
        closed = _Seen("closed", time.monotonic() + REFRESH, opened)
        self._see(limits, closed, ours=bool(reply[0]), woken=len(runs))
        if runs and self.wake is not None:
            try:
                await self.wake(runs)
            except Exception as exc:  # they come back at the end of their countdowns
                log.warning("could not wake %d waiting runs: %s", len(runs), type(exc).__name__)

    async def abandon(self, ticket: Ticket) -> None:
        if not ticket.probe:
            return
        try:
            await self._run(_ABANDON, ticket.limits.key, ticket.id)
        except (redis.RedisError, OSError, ValueError) as exc:  # its lease frees it later
            self._unavailable(ticket.limits, exc)
        self._seen.pop(ticket.limits.key, None)

    # -- the runs that wait ------------------------------------------------------------------

    async def waiting(
        self, key: str, run_id: str, batch_id: str | None, *, probing: bool = False
    ) -> Wait | None:
        # A prober not seen for a few probes' time has gone (cancelled, its worker lost).
        stale = int(3 * self.probe_every * 1e6)
        try:
            reply = await self._run(
                _WAIT, key, run_id, batch_id or "", _TTL_MS, 1 if probing else 0, stale
            )
        except (redis.RedisError, OSError, ValueError) as exc:
            self._unavailable(None, exc)
            return Wait(time.time(), probing)
        if reply is None:
            return None
        since, prober = cast(list[Any], reply)
        return Wait(int(since) / 1e6, bool(prober))

    async def still_waiting(self, key: str, run_id: str) -> bool:
        try:
            return bool(await (await self._redis.get()).client.hexists(self.keys(key)[1], run_id))
        except (redis.RedisError, OSError, ValueError) as exc:
            self._unavailable(None, exc)
            return True


def decoded(value: object) -> str:
    """A value Redis returned, as text ("" for none)."""
    return value.decode() if isinstance(value, bytes) else str(value or "")

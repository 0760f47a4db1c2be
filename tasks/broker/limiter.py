"""Provider limits shared by every worker: `RedisLimiter`, on the broker's Redis.

Each limited provider has two keys under the settings' key prefix:

    {prefix}limits:{<key>}:state     hash: req, tok (the next free moment of each clock,
                                     in microseconds of Redis's TIME), pause (until when
                                     a 429's Retry-After holds every caller), extra (the
                                     average tokens a call used beyond its prompt's estimate)
    {prefix}limits:{<key>}:inflight  sorted set: one member per call holding a slot,
                                     scored with the moment its lease runs out

One Lua script takes a call's turn (one round trip): it reserves the next free
moment on the requests clock (each call moves it 60 / requests_per_minute s on)
and on the tokens clock (each moves it by its tokens' share of a minute), after
any pause, and an in-flight slot; or, when that moment is further away than the
caller may wait, reserves nothing and says how far it is. The caller then
sleeps until its moment: an asyncio sleep, no polling, no CPU. Another script
releases the slot and corrects the tokens clock by what the reply really used.
Redis's own clock is the only one read, so workers' clocks never disagree.

Only a full in-flight cap has no moment to sleep to. In each process one
caller per provider asks Redis, the others wait behind it in order; it tries
again when a call of this process ends, or every `poll` seconds for the others.

When Redis cannot be reached the calls go unlimited (a warning, and the
`after_unavailable` hook): the provider's own 429s and the turn's retries are
the fallback, and no turn waits on a broker outage.

Observing: `COUNTERS` counts waits, re-queues and 429s per provider in this
process; `add_hooks(LimiterHooks())` adds your own (metrics).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, cast

import redis
import redis.asyncio as aioredis

from relayq import Usage
from relayq.agents import Agent
from relayq.circuit import CircuitModel
from relayq.hooking import Emitter
from relayq.model import Model
from relayq.ratelimit import (
    LimitCounters,
    LimitedModel,
    Limiter,
    LimiterHooks,
    LimiterUnavailable,
    LimitWait,
    Permit,
    ProviderLimits,
    Throttled,
    WaitReason,
    limiter_hooks,
)
from tasks.broker.circuit import circuit_for
from tasks.broker.redis_clients import DEFAULT_BOUNDS, FailOpen, RedisBounds, redis_pool
from tasks.settings import Settings

__all__ = [
    "COUNTERS",
    "RedisLimiter",
    "add_hooks",
    "limited_model",
    "limiter_for",
]

log = logging.getLogger(__name__)

COUNTERS = LimitCounters()
"""This process's waits, re-queues and provider rejections, per provider label."""
_HOOKS = limiter_hooks([COUNTERS])

_MINUTE_US = 60_000_000

# KEYS: state, inflight. ARGV: permit, rpm, tpm, cap, prompt tokens, completion tokens
# (-1: the learned average), max wait (us), lease (us). 0 for a limit means none.
# Returns {granted, wait (us), reason, pause left (us), tokens counted}.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local rpm, tpm, cap = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local st = redis.call('HMGET', KEYS[1], 'req', 'tok', 'extra', 'pause')
local req, tok = tonumber(st[1]) or 0, tonumber(st[2]) or 0
local extra, pause = tonumber(st[3]) or 0, tonumber(st[4]) or 0
local pause_left = math.max(0, pause - now)
if cap > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if redis.call('ZCARD', KEYS[2]) >= cap then
    local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    return {0, math.floor(tonumber(first[2]) - now), 'in_flight', pause_left, 0}
  end
end
local completion = tonumber(ARGV[6])
if completion < 0 then completion = extra end
local cost = math.floor(tonumber(ARGV[5]) + completion + 0.5)
local at, reason = now, 'none'
if pause > at then at, reason = pause, 'paused' end
if rpm > 0 and req > at then at, reason = req, 'requests' end
if tpm > 0 and tok > at then at, reason = tok, 'tokens' end
local wait = at - now
if wait > tonumber(ARGV[7]) then
  return {0, math.floor(wait), reason, pause_left, 0}
end
if rpm > 0 then
  redis.call('HSET', KEYS[1], 'req', string.format('%.0f', at + 60000000 / rpm))
end
if tpm > 0 then
  redis.call('HSET', KEYS[1], 'tok', string.format('%.0f', at + cost * 60000000 / tpm))
end
redis.call('PEXPIRE', KEYS[1], 86400000)
if cap > 0 then
  redis.call('ZADD', KEYS[2], string.format('%.0f', at + tonumber(ARGV[8])), ARGV[1])
  local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', KEYS[2], math.floor(tonumber(last[2]) / 1000) + 1000)
end
return {1, math.floor(wait), reason, pause_left, cost}
"""

# KEYS: state, inflight. ARGV: permit, tpm, tokens counted, prompt estimate, tokens used
# (-1: unknown), learn (1: the reply's usage teaches the average beyond the prompt).
_RELEASE = """
redis.call('ZREM', KEYS[2], ARGV[1])
local used = tonumber(ARGV[5])
if used < 0 then return 0 end
local tpm = tonumber(ARGV[2])
if tpm > 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local tok = tonumber(redis.call('HGET', KEYS[1], 'tok')) or now
  local delta = (used - tonumber(ARGV[3])) * 60000000 / tpm
  if delta > 0 then tok = math.max(tok, now) + delta else tok = tok + delta end
  redis.call('HSET', KEYS[1], 'tok', string.format('%.0f', tok))
end
if ARGV[6] == '1' then
  local seen = math.max(0, used - tonumber(ARGV[4]))
  local extra = tonumber(redis.call('HGET', KEYS[1], 'extra'))
  if extra then extra = extra + 0.2 * (seen - extra) else extra = seen end
  redis.call('HSET', KEYS[1], 'extra', string.format('%.1f', extra))
end
redis.call('PEXPIRE', KEYS[1], 86400000)
return 1
"""

# KEYS: state. ARGV: seconds (us). Returns the pause left (us).
_PAUSE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local until_ = now + tonumber(ARGV[1])
local pause = tonumber(redis.call('HGET', KEYS[1], 'pause')) or 0
if until_ > pause then
  redis.call('HSET', KEYS[1], 'pause', string.format('%.0f', until_))
  pause = until_
end
redis.call('PEXPIRE', KEYS[1], 86400000)
return math.floor(pause - now)
"""


@dataclass(frozen=True)
class _Grant:
    granted: bool
    wait: float
    """Seconds until the reserved moment (granted), or until capacity (not granted)."""
    reason: WaitReason | None
    pause_left: float
    tokens: int


@dataclass
class _Gate:
    """This process's callers of one provider: one asks Redis at a time, in order."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    freed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a call of this process hands its slot back."""
    paused_until: float = 0.0
    """The latest pause this process knows of, in the loop's time."""


@dataclass
class _Conn:
    """What one event loop uses: its own Redis pool (a pool cannot cross loops)."""

    client: aioredis.Redis
    acquire: Any
    release: Any
    pause: Any
    gates: dict[str, _Gate] = field(default_factory=dict)

    def gate(self, key: str) -> _Gate:
        gate = self.gates.get(key)
        if gate is None:
            gate = self.gates[key] = _Gate()
        return gate


class RedisLimiter(Limiter):
    """Provider limits kept in Redis, shared by every process that uses the same keys.

    RedisLimiter("redis://127.0.0.1:6379/0", prefix="relayq:")
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str,
        hooks: Iterable[LimiterHooks] | Emitter[LimiterHooks] = (),
        poll: float = 0.02,
        retry_unavailable: float = 5.0,
        bounds: RedisBounds = DEFAULT_BOUNDS,
    ) -> None:
        super().__init__(hooks)
        self.url = url
        self.bounds = bounds
        self.prefix = prefix
        self.poll = poll
        """Seconds between tries at a full in-flight cap, for slots freed by other processes."""
        self._redis = FailOpen(
            self._open, client=lambda conn: conn.client, retry_after=retry_unavailable
        )
        """Calls go unlimited for `retry_unavailable` seconds after Redis failed."""

    def __repr__(self) -> str:
        return f"RedisLimiter(prefix={self.prefix!r})"  # never the URL: it may hold a password

    def _open(self) -> _Conn:
        client = redis_pool(self.url, owner="limiter", max_connections=32, bounds=self.bounds)
        return _Conn(
            client,
            client.register_script(_ACQUIRE),
            client.register_script(_RELEASE),
            client.register_script(_PAUSE),
        )

    def keys(self, limits: ProviderLimits) -> list[str]:
        """The provider's state and in-flight keys (one hash slot, for a Redis cluster)."""
        base = f"{self.prefix}limits:{{{limits.key}}}"
        return [f"{base}:state", f"{base}:inflight"]

    async def aclose(self) -> None:
        """Close this event loop's connections."""
        await self._redis.aclose()

    # -- acquire ------------------------------------------------------------------------------

    async def acquire(
        self, limits: ProviderLimits, *, prompt_tokens: int, max_wait: float
    ) -> Permit:
        loop = asyncio.get_running_loop()
        started = loop.time()
        if self._redis.down:
            return self._unlimited(limits, prompt_tokens, "still unreachable")
        try:
            conn = await self._redis.get()
        except ValueError as exc:  # a broker URL redis-py reads otherwise than kombu
            self._redis.failed()
            return self._unlimited(limits, prompt_tokens, type(exc).__name__)
        gate = conn.gate(limits.key)
        while True:
            permit = Permit(limits=limits, id=uuid.uuid4().hex, prompt_tokens=prompt_tokens)
            try:
                grant = await self._reserve(conn, gate, permit, started, max_wait)
            except (redis.RedisError, OSError) as exc:
                self._redis.failed()
                return self._unlimited(limits, prompt_tokens, type(exc).__name__)
            permit = Permit(
                limits=limits, id=permit.id, tokens=grant.tokens, prompt_tokens=prompt_tokens
            )
            seen = gate.paused_until
            await self._sleep_holding(permit, grant.wait)
            # A 429 met by a call of this process after our moment was reserved.
            if gate.paused_until <= seen + 0.01 or gate.paused_until <= loop.time():
                break
            await self.release(permit, used=Usage())
        waited = loop.time() - started
        if grant.reason is not None and waited > 0.001:
            self.hooks.emit_now(LimitWait(**limits.names(), seconds=waited, reason=grant.reason))
        return permit

    async def _reserve(
        self, conn: _Conn, gate: _Gate, permit: Permit, started: float, max_wait: float
    ) -> _Grant:
        """The moment reserved for `permit` (under this process's gate: one caller at a time);
        Throttled when there is none within `max_wait` of `started`."""
        loop = asyncio.get_running_loop()
        full = False
        async with gate.lock:
            while True:
                gate.freed.clear()
                left = max(0.0, started + max_wait - loop.time())
                grant = await self._ask(conn, permit, left)
                if grant.pause_left > 0:
                    gate.paused_until = max(gate.paused_until, loop.time() + grant.pause_left)
                if grant.granted:
                    return (
                        replace(grant, reason="in_flight") if full and not grant.reason else grant
                    )
                if grant.reason != "in_flight" or left <= 0:
                    raise self._throttled(permit.limits, grant, max_wait)
                # No moment to sleep to: wait for a slot freed here, or look again soon.
                full = True
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(self.poll, grant.wait, left)):
                        await gate.freed.wait()

    def _throttled(self, limits: ProviderLimits, grant: _Grant, max_wait: float) -> Throttled:
        """Come back a little before the capacity would be there, to wait the rest in place;
        for a full in-flight cap, whose end is unknown, in about `max_wait`."""
        if grant.reason == "in_flight":
            retry_in = max(1.0, max_wait) * random.uniform(0.5, 1.0)
        else:
            retry_in = max(0.5, grant.wait - max_wait / 2) * random.uniform(0.9, 1.1)
        reason = grant.reason or "requests"
        self.hooks.emit_now(
            LimitWait(**limits.names(), seconds=retry_in, reason=reason, requeued=True)
        )
        return Throttled(limits.label, retry_in, reason)

    async def _ask(self, conn: _Conn, permit: Permit, max_wait: float) -> _Grant:
        limits = permit.limits
        reply = await conn.acquire(
            keys=self.keys(limits),
            args=[
                permit.id,
                limits.requests_per_minute or 0,
                limits.tokens_per_minute or 0,
                limits.max_in_flight or 0,
                permit.prompt_tokens,
                -1 if limits.completion_tokens is None else limits.completion_tokens,
                int(max_wait * 1e6),
                int(limits.lease * 1e6),
            ],
        )
        granted, wait, reason, pause_left, tokens = cast(list[Any], reply)
        name = reason.decode() if isinstance(reason, bytes) else str(reason)
        return _Grant(
            granted=bool(granted),
            wait=max(0.0, int(wait) / 1e6),
            reason=None if name == "none" else cast(WaitReason, name),
            pause_left=int(pause_left) / 1e6,
            tokens=int(tokens),
        )

    async def _sleep_holding(self, permit: Permit, seconds: float) -> None:
        """Sleep until the reserved moment; a caller cancelled meanwhile frees its slot."""
        if seconds <= 0:
            return
        try:
            await asyncio.sleep(seconds)
        except BaseException:
            await asyncio.shield(self.release(permit, used=Usage()))
            raise

    def _unlimited(self, limits: ProviderLimits, prompt_tokens: int, why: str) -> Permit:
        if self._redis.say_now():
            log.warning("provider limits unavailable (%s): %s goes unlimited", why, limits.label)
        self.hooks.emit_now(LimiterUnavailable(**limits.names(), error=why))
        return Permit(limits=limits, tokens=prompt_tokens, prompt_tokens=prompt_tokens)

    # -- release and pause --------------------------------------------------------------------

    async def release(self, permit: Permit, *, used: Usage | None) -> None:
        limits = permit.limits
        if not permit.id or not (limits.max_in_flight or limits.tokens_per_minute):
            return  # went unlimited, or holds nothing to give back or correct
        conn = self._redis.here()
        if conn is None:
            return  # its loop's connections were closed meanwhile: the lease frees the slot
        tokens = -1
        if used is not None:
            tokens = used.total_tokens or used.prompt_tokens + used.completion_tokens
        learn = tokens > 0 and limits.completion_tokens is None and limits.tokens_per_minute
        try:
            await conn.release(
                keys=self.keys(limits),
                args=[
                    permit.id,
                    limits.tokens_per_minute or 0,
                    permit.tokens,
                    permit.prompt_tokens,
                    tokens,
                    1 if learn else 0,
                ],
            )
        except (redis.RedisError, OSError) as exc:  # its lease frees the slot later
            log.warning("could not release a %s slot: %s", limits.label, type(exc).__name__)
        finally:
            gate = conn.gates.get(limits.key)
            if gate is not None:
                gate.freed.set()

    async def rejected(
        self, limits: ProviderLimits, *, status: int, retry_after: float | None
    ) -> None:
        if retry_after is not None and retry_after > 0:
            conn = await self._redis.get()
            gate = conn.gate(limits.key)
            loop = asyncio.get_running_loop()
            gate.paused_until = max(gate.paused_until, loop.time() + retry_after)
            try:
                await conn.pause(keys=self.keys(limits)[:1], args=[int(retry_after * 1e6)])
            except (redis.RedisError, OSError) as exc:
                log.warning("could not pause %s: %s", limits.label, type(exc).__name__)
        await super().rejected(limits, status=status, retry_after=retry_after)


# -- the process's limiter --------------------------------------------------------------------

_limiters: dict[tuple[int, str, str], Limiter] = {}
_lock = threading.Lock()
_WATCHER = Limiter(_HOOKS)
"""For providers without limits: every call at once, 429s told to the hooks."""


def add_hooks(hooks: LimiterHooks) -> None:
    """Tell `hooks` of every limiter wait, re-queue and provider rejection in this process."""
    _HOOKS.add(hooks)


def limiter_for(settings: Settings) -> Limiter:
    """This process's limiter: on the broker's Redis, under the settings' key prefix."""
    key = (os.getpid(), settings.broker_url, settings.key_prefix)
    with _lock:
        limiter = _limiters.get(key)
        if limiter is None:
            url = settings.redis_url
            if url is None:
                log.warning("provider limits need a Redis broker; calls go unlimited")
                limiter = Limiter(_HOOKS)
            else:
                limiter = RedisLimiter(
                    url, prefix=settings.key_prefix, hooks=_HOOKS, bounds=RedisBounds.of(settings)
                )
            _limiters[key] = limiter
        return limiter


def limited_model(settings: Settings, agent: Agent, time_limit: float) -> Model:
    """The model a worker's turn of `agent` calls: through its provider's circuit
    (`tasks.broker.circuit`), then under its limits, if it sets any; a provider without limits
    is only watched (its 429s told to the hooks).

    A turn waits in place for capacity up to RELAYQ_LIMIT_WAIT, and never more than
    half its time limit; a longer wait is a Throttled, and the turn goes back to its queue.
    While the circuit is open a call is a ProviderDown, and the turn waits in its queue.
    """
    if agent.provider is None:
        return agent.durable_model
    limits = ProviderLimits.of(agent.provider.config)
    limiter = limiter_for(settings) if limits.limited else _WATCHER
    max_wait = min(settings.providers.limit_wait.total_seconds(), time_limit / 2)
    limited = LimitedModel(agent.durable_model, limiter, limits, max_wait=max_wait)
    return CircuitModel(limited, circuit_for(settings), limits)

"""Provider limits: requests and tokens per minute and calls in flight, for every caller at once.

A model call under limits goes through a `Limiter`:

    acquire   wait until the provider has room for the call (or raise Throttled
              when that is further away than the caller may wait in place)
    the call
    release   give the in-flight slot back, and count the tokens the reply used
    rejected  a 429 or 529: with Retry-After, every caller waits it out

`LimitedModel` drives those steps around any model. The `Limiter` base is the
no-op (every call goes at once); `tasks.broker.limiter.RedisLimiter` keeps the counts
in Redis, so all worker processes share them. Calls are spaced evenly rather
than let through in bursts: at 600 requests per minute, one every 100 ms, so
any window of t seconds holds at most ceil(t * 600 / 60) of them (as they
start; the provider sees them a network trip later).

    limits = ProviderLimits.of(config)
    model = LimitedModel(provider_model, limiter, limits, max_wait=30.0)
    reply = await model(request)  # Throttled(retry_in=...) if the wait is longer

Waits and rejections are told to `LimiterHooks` (`LimitCounters` counts them).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, TypedDict
from urllib.parse import urlsplit

from relayq._errors import ModelError, RelayqError
from relayq._types import Usage
from relayq.hooking import Emitter, HookEvent
from relayq.model import InProcessRequest, InProcessResponse, Model
from relayq.providers import ProviderConfig

__all__ = [
    # what is limited
    "PAUSING_STATUS",
    "ProviderLimits",
    "ProviderNames",
    "estimate_prompt_tokens",
    # the limiter and the model it wraps
    "LimitedModel",
    "Limiter",
    "Permit",
    "Throttled",
    # hooks
    "LimitCounters",
    "LimitWait",
    "LimiterHooks",
    "LimiterUnavailable",
    "ProviderCounts",
    "ProviderRejected",
    "WaitReason",
    "limiter_hooks",
]

log = logging.getLogger(__name__)

PAUSING_STATUS = frozenset({429, 529})
"""Statuses that say the provider is over its limit or overloaded: with a Retry-After,
the provider is paused for every caller."""

WaitReason = Literal["requests", "tokens", "in_flight", "paused"]


class ProviderNames(TypedDict):
    provider: str
    host: str
    model: str


DEFAULT_LEASE_MARGIN = 30.0
"""Seconds an in-flight slot outlives its call's timeout, so a caller that died holding
it (a killed worker) frees it by itself."""


@dataclass(frozen=True, kw_only=True)
class ProviderLimits:
    """One endpoint's limits, as a limiter needs them; no secret in it."""

    key: str
    """Where the counts are kept: the same for every process calling this endpoint and model
    with this key variable."""
    label: str
    """`host/model`, for logs and hooks."""
    host: str = ""
    """The endpoint's host, never its user, password, port or path."""
    model: str = ""
    requests_per_minute: int | None = None
    """Calls a minute, one every 60 / requests_per_minute seconds; None: no limit."""
    tokens_per_minute: int | None = None
    """Tokens a minute: each call moves the tokens clock on by its share; None: no limit."""
    max_in_flight: int | None = None
    """Calls at once; None: no limit."""
    completion_tokens: int | None = None
    """Tokens a reply is counted at before it is known: the config's `max_tokens`; None: the
    average the limiter has seen."""
    lease: float = 120.0 + DEFAULT_LEASE_MARGIN
    """Seconds an in-flight slot is held at most."""

    def names(self) -> ProviderNames:
        """What an event says of the provider: `provider` (the label), `host`, `model`."""
        return {"provider": self.label, "host": self.host, "model": self.model}

    @property
    def limited(self) -> bool:
        """Whether any limit is set; unlimited calls are only watched (their 429s told)."""
        return any(
            n is not None
            for n in (self.requests_per_minute, self.tokens_per_minute, self.max_in_flight)
        )

    @classmethod
    def of(cls, config: ProviderConfig) -> ProviderLimits:
        """The limits `config` sets (perhaps none: see `limited`)."""
        identity = "\n".join(
            (config.style, config.base_url.rstrip("/"), config.model, config.api_key_env or "")
        )
        host = urlsplit(config.base_url).hostname or "?"  # never the userinfo of the URL
        return cls(
            key=hashlib.sha256(identity.encode()).hexdigest()[:16],
            label=f"{host}/{config.model}",
            host=host,
            model=config.model,
            requests_per_minute=config.requests_per_minute,
            tokens_per_minute=config.tokens_per_minute,
            max_in_flight=config.max_in_flight,
            completion_tokens=config.max_tokens,
            lease=config.timeout + DEFAULT_LEASE_MARGIN,
        )


def estimate_prompt_tokens(request: InProcessRequest) -> int:
    """The request's size in tokens, roughly: a token per 4 characters of its JSON."""
    size = len(json.dumps(request.messages, ensure_ascii=False, default=str))
    size += len(json.dumps(request.tools, ensure_ascii=False, default=str))
    return size // 4 + 1


class Throttled(RelayqError):
    """The provider has no room for this call sooner than the caller may wait in place.

    Not an error: the durable turn goes back to its queue and comes back in
    `retry_in` seconds, without counting a failed try. Pickles whole.
    """

    def __init__(self, provider: str, retry_in: float, reason: WaitReason) -> None:
        super().__init__(provider, retry_in, reason)
        self.provider = provider
        self.retry_in = retry_in
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.provider}: no capacity ({self.reason}); again in {self.retry_in:.1f} s"


@dataclass(frozen=True, kw_only=True)
class Permit:
    """Leave to make one call; hand it back to `Limiter.release`."""

    limits: ProviderLimits
    id: str = ""
    """The in-flight slot's name; "" when none was taken."""
    tokens: int = 0
    """Tokens the call was counted at when it started."""
    prompt_tokens: int = 0
    """The prompt's estimate (`estimate_prompt_tokens`)."""


# -- hooks ------------------------------------------------------------------------------------


class LimiterHooks:
    """Told of every wait and rejection; a no-op here. A failing hook is logged and skipped."""

    def after_wait(self, event: LimitWait) -> None:
        """A call waited (in place, or by going back to its queue)."""

    def after_rejected(self, event: ProviderRejected) -> None:
        """The provider refused a call for load."""

    def after_unavailable(self, event: LimiterUnavailable) -> None:
        """The limiter's store failed; the call went unlimited."""


def limiter_hooks(hooks: Iterable[LimiterHooks] = ()) -> Emitter[LimiterHooks]:
    """An emitter of the limiter's events, to `hooks` (`relayq.hooking`)."""
    return Emitter(
        hooks, base=LimiterHooks, failure="a limiter hook failed in %(method)s (%(error)s)"
    )


@dataclass(frozen=True, kw_only=True)
class LimitWait(HookEvent, hook=LimiterHooks.after_wait):
    """A call waited for its provider, or was sent back to its queue to wait there."""

    provider: str
    """The provider's label, `host/model`."""
    host: str = ""
    model: str = ""
    seconds: float
    """How long it waited in place; when `requeued`, the countdown it went back with."""
    reason: WaitReason
    requeued: bool = False


@dataclass(frozen=True, kw_only=True)
class ProviderRejected(HookEvent, hook=LimiterHooks.after_rejected):
    """The provider answered 429 or 529."""

    provider: str
    host: str = ""
    model: str = ""
    status: int
    retry_after: float | None
    """Seconds the provider asked for; every caller now waits them out. None: no pause."""


@dataclass(frozen=True, kw_only=True)
class LimiterUnavailable(HookEvent, hook=LimiterHooks.after_unavailable):
    """The limiter's store could not be reached: calls go unlimited until it answers again."""

    provider: str
    host: str = ""
    model: str = ""
    error: str
    """The error's type, nothing more (a message may hold an address)."""


@dataclass
class ProviderCounts:
    """What happened to one provider's calls in this process."""

    waits: int = 0
    """Calls that waited in place."""
    wait_seconds: float = 0.0
    """Their waits, summed."""
    requeued: int = 0
    """Turns sent back to their queue to wait there."""
    rejected: int = 0
    """429s and 529s received."""
    paused_seconds: float = 0.0
    """Retry-After pauses the provider asked for, summed."""
    unavailable: int = 0
    """Calls that went unlimited because the limiter's store failed."""


@dataclass
class LimitCounters(LimiterHooks):
    """Counts per provider label; `snapshot()` copies them (thread-safe)."""

    counts: dict[str, ProviderCounts] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def _of(self, provider: str) -> ProviderCounts:
        return self.counts.setdefault(provider, ProviderCounts())

    def after_wait(self, event: LimitWait) -> None:
        with self._lock:
            counts = self._of(event.provider)
            if event.requeued:
                counts.requeued += 1
            else:
                counts.waits += 1
                counts.wait_seconds += event.seconds

    def after_rejected(self, event: ProviderRejected) -> None:
        with self._lock:
            counts = self._of(event.provider)
            counts.rejected += 1
            counts.paused_seconds += event.retry_after or 0.0

    def after_unavailable(self, event: LimiterUnavailable) -> None:
        with self._lock:
            self._of(event.provider).unavailable += 1

    def snapshot(self) -> dict[str, ProviderCounts]:
        with self._lock:
            return {k: ProviderCounts(**vars(v)) for k, v in self.counts.items()}


# -- the limiter ------------------------------------------------------------------------------


class Limiter:
    """Says when a limited call may go. This base lets every call go at once."""

    def __init__(self, hooks: Iterable[LimiterHooks] | Emitter[LimiterHooks] = ()) -> None:
        self.hooks = hooks if isinstance(hooks, Emitter) else limiter_hooks(hooks)
        """Told of waits and rejections (`relayq.hooking`); an emitter given here, shared
        by several limiters, may take more hooks later."""

    async def acquire(
        self, limits: ProviderLimits, *, prompt_tokens: int, max_wait: float
    ) -> Permit:
        """Wait until the call may go and return its permit; Throttled when that is more
        than `max_wait` seconds away."""
        return Permit(limits=limits, tokens=prompt_tokens, prompt_tokens=prompt_tokens)

    async def release(self, permit: Permit, *, used: Usage | None) -> None:
        """The call ended: its in-flight slot is free, and it used `used` tokens
        (None: as estimated; zero usage: refused, nothing spent)."""

    async def rejected(
        self, limits: ProviderLimits, *, status: int, retry_after: float | None
    ) -> None:
        """The provider refused a call for load (429, 529); a limiter that shares limits
        pauses the provider for every caller for `retry_after` seconds."""
        self.hooks.emit_now(
            ProviderRejected(**limits.names(), status=status, retry_after=retry_after)
        )


class LimitedModel:
    """A model whose calls keep to `limits`: acquire, call, release, and pause on a 429."""

    def __init__(
        self, model: Model, limiter: Limiter, limits: ProviderLimits, *, max_wait: float
    ) -> None:
        self.model = model
        self.limiter = limiter
        self.limits = limits
        self.max_wait = max_wait
        """Seconds a call may wait in place for capacity; beyond, Throttled."""

    async def __call__(self, request: InProcessRequest) -> InProcessResponse:
        # Only a tokens limit reads the estimate: a large transcript costs its encoding.
        tokens = estimate_prompt_tokens(request) if self.limits.tokens_per_minute else 0
        permit = await self.limiter.acquire(
            self.limits, prompt_tokens=tokens, max_wait=self.max_wait
        )
        used: Usage | None = None
        try:
            reply = await self.model(request)
            used = reply.usage
            return reply
        except ModelError as exc:
            if exc.status in PAUSING_STATUS:
                used = Usage()  # refused: the provider counted nothing
                await self.limiter.rejected(
                    self.limits, status=exc.status, retry_after=exc.retry_after
                )
            raise
        finally:
            # Shielded: a turn cancelled mid-call (its deadline) still frees its slot.
            await asyncio.shield(self.limiter.release(permit, used=used))

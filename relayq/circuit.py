"""Provider circuits: an outage seen once holds every caller's turns, instead of failing them.

    closed     calls go
    open       calls are kept back (ProviderDown): a durable turn goes back to its
               queue without spending a try, and waits for the provider
    half_open  one probe call at a time tests the provider: its answer closes the
               circuit for every caller, its failure opens it again until the next

What opens it (`outage_of`): the provider unreachable, not answering in time, or
answering 5xx. A 429 does not (the limiter pauses the provider for that), nor
does any other 4xx: no wait fixes a bad request, a bad key or a missing model,
and the error stands at once. Any answer that is not a 5xx closes it: the
provider is there.

`CircuitModel` drives those steps around any model. The `Circuit` base is the
no-op (always closed: every error stands); `tasks.broker.circuit.RedisCircuit` keeps the
state in Redis, so all worker processes share one circuit per provider.

    model = CircuitModel(provider_model, circuit, ProviderLimits.of(config))
    reply = await model(request)  # ProviderDown(retry_in=...) while the circuit is open

Changes are told to `CircuitHooks` (logs, metrics).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from relayq._errors import ModelError
from relayq.hooking import Emitter, HookEvent
from relayq.model import InProcessRequest, InProcessResponse, Model
from relayq.ratelimit import ProviderLimits
from relayq.retry import MAX_DELAY

__all__ = [
    # what opens a circuit
    "OutageKind",
    "outage_of",
    # the circuit and the model it wraps
    "Circuit",
    "CircuitModel",
    "CircuitState",
    "ProviderDown",
    "Ticket",
    "Wait",
    "outage_countdown",
    # hooks
    "CircuitChange",
    "CircuitHooks",
    "circuit_hooks",
]

log = logging.getLogger(__name__)

OutageKind = Literal["unreachable", "timeout", "server_error"]
CircuitState = Literal["closed", "open", "half_open"]


def outage_of(exc: BaseException) -> OutageKind | None:
    """What kind of outage `exc` shows, or None when it shows none (an answer, a 4xx, a
    turn that ran out of time for its own reasons)."""
    if not isinstance(exc, ModelError) or isinstance(exc, ProviderDown):
        return None
    if exc.unanswered is not None:
        return exc.unanswered
    if exc.status is not None and 500 <= exc.status <= 599:
        return "server_error"
    return None


class ProviderDown(ModelError):
    """The provider's circuit is open: this call was kept back, or failed and found it so.

    Not a failure of the run: the durable turn goes back to its queue for
    `retry_in` seconds without spending a try (`probing`: to make the next probe
    call). `opened_at` (Unix seconds) is when the circuit opened; `error` the
    outage's last error as stored. Pickles whole.
    """

    def __init__(
        self,
        provider: str,
        key: str,
        opened_at: float,
        retry_in: float,
        *,
        probing: bool = False,
        called: bool = False,
        kind: OutageKind | None = None,
        error: str = "",
    ) -> None:
        super().__init__(
            f"{provider}: circuit open ({kind or 'outage'}); again in {retry_in:.1f} s",
            retryable=True,
            retry_after=retry_in,
        )
        self.provider = provider
        """The provider's label, `host/model`."""
        self.key = key
        """The provider's circuit (`ProviderLimits.key`)."""
        self.opened_at = opened_at
        self.retry_in = retry_in
        self.probing = probing
        self.called = called
        """The call reached for the provider (and failed); False: it was kept back."""
        self.kind = kind
        self.error = error

    def __reduce__(self) -> tuple[object, ...]:
        return (
            _rebuild_provider_down,
            (self.provider, self.key, self.opened_at, self.retry_in, self.probing, self.called,
             self.kind, self.error),
        )  # fmt: skip


def _rebuild_provider_down(
    provider: str,
    key: str,
    opened_at: float,
    retry_in: float,
    probing: bool,
    called: bool,
    kind: OutageKind | None,
    error: str,
) -> ProviderDown:
    return ProviderDown(
        provider, key, opened_at, retry_in, probing=probing, called=called, kind=kind, error=error
    )


@dataclass(frozen=True)
class Wait:
    """A run's wait for an open circuit (`Circuit.waiting`)."""

    since: float
    """When the run began to wait, this outage (Unix seconds)."""
    probing: bool
    """The run is the circuit's prober: it comes back for the next probe."""


def outage_countdown(
    retry_in: float, waited: float, probe_every: float, limit: float, *, probing: bool
) -> float:
    """Seconds a turn kept back by an open circuit waits in its queue, having waited
    `waited` of its outage `limit` so far; the next probe is due in `retry_in`.

    The prober comes back for the probe. The others are woken when the circuit
    closes, so theirs only stands in for a lost wake-up (or a prober gone): it
    grows with the outage (half the wait so far), jittered, so that a long one
    costs each run a few re-queues an hour; it never runs past the run's limit,
    nor past MAX_DELAY.
    """
    seconds = retry_in if probing else max(probe_every, waited / 2) * random.uniform(0.8, 1.2)
    return max(0.0, min(seconds, limit - waited + 0.05, MAX_DELAY))


@dataclass(frozen=True, kw_only=True)
class Ticket:
    """Leave to make one call; its end goes back to the circuit (`failed`, `answered`)."""

    limits: ProviderLimits
    id: str = ""
    probe: bool = False
    """This call is the probe of a half-open circuit: the only one to go."""


# -- hooks ------------------------------------------------------------------------------------


class CircuitHooks:
    """Told of every change of a circuit; a no-op here. A failing hook is logged and skipped."""

    def after_change(self, event: CircuitChange) -> None:
        """A circuit opened, is probed, or closed."""


def circuit_hooks(hooks: Iterable[CircuitHooks] = ()) -> Emitter[CircuitHooks]:
    """An emitter of circuit changes, to `hooks` (`relayq.hooking`)."""
    return Emitter(
        hooks, base=CircuitHooks, failure="a circuit hook failed in %(method)s (%(error)s)"
    )


@dataclass(frozen=True, kw_only=True)
class CircuitChange(HookEvent, hook=CircuitHooks.after_change):
    """A provider's circuit changed, as this process saw it."""

    provider: str
    """The provider's label, `host/model`."""
    host: str = ""
    model: str = ""
    state: CircuitState
    """`open`: opened, or open again after a failed probe; `half_open`: this process
    probes; `closed`: the provider answered."""
    kind: OutageKind | None = None
    """What opened it (the last outage error's kind)."""
    opened_at: float | None = None
    """When it opened (Unix seconds)."""
    woken: int = 0
    """When it closed here: the runs that had waited for it, woken."""
    probe_failed: bool = False
    """`open` again because this process's probe failed (it was open already)."""


# -- the circuit ------------------------------------------------------------------------------


class Circuit:
    """Whether a provider's calls may go. This base is always closed: every error stands."""

    def __init__(self, hooks: Iterable[CircuitHooks] | Emitter[CircuitHooks] = ()) -> None:
        self.hooks = hooks if isinstance(hooks, Emitter) else circuit_hooks(hooks)
        """Told of changes (`relayq.hooking`); an emitter given here, shared by several
        circuits, may take more hooks later."""

    async def admit(self, limits: ProviderLimits) -> Ticket:
        """Leave to call the provider; ProviderDown while its circuit is open."""
        return Ticket(limits=limits)

    async def failed(
        self, ticket: Ticket, kind: OutageKind, error: str, *, retry_after: float | None = None
    ) -> ProviderDown | None:
        """The call failed for an outage: the circuit opens (or stays open). Returns the
        signal to raise in place of the error; None: no circuit, the error stands."""
        return None

    async def answered(self, ticket: Ticket) -> None:
        """The provider answered the call (a reply, or an error that is no outage)."""

    async def abandon(self, ticket: Ticket) -> None:
        """The call ended without an answer or an outage (cancelled, throttled): a probe's
        turn goes to the next caller."""

    async def waiting(
        self, key: str, run_id: str, batch_id: str | None, *, probing: bool = False
    ) -> Wait | None:
        """Note that run `run_id` waits for the circuit `key` (`probing`: its turn was told
        to make the next probe); None when the circuit is closed."""
        return None

    async def still_waiting(self, key: str, run_id: str) -> bool:
        """Whether run `run_id` still waits for circuit `key` (False: it was woken)."""
        return False


class CircuitModel:
    """A model whose calls go through their provider's circuit: admit, call, and tell it
    whether the provider answered."""

    def __init__(self, model: Model, circuit: Circuit, limits: ProviderLimits) -> None:
        self.model = model
        self.circuit = circuit
        self.limits = limits

    async def __call__(self, request: InProcessRequest) -> InProcessResponse:
        ticket = await self.circuit.admit(self.limits)
        try:
            reply = await self.model(request)
        except ModelError as exc:
            await self._failed(ticket, exc)
            raise
        except BaseException:
            # Shielded: a turn cancelled mid-call (its deadline) still hands its probe on.
            await asyncio.shield(self.circuit.abandon(ticket))
            raise
        await self.circuit.answered(ticket)
        return reply

    async def _failed(self, ticket: Ticket, exc: ModelError) -> None:
        """Tell the circuit how the call failed; raises ProviderDown for an outage it holds."""
        kind = outage_of(exc)
        if kind is None:
            if exc.status is not None:
                await self.circuit.answered(ticket)
            else:
                await self.circuit.abandon(ticket)
            return
        down = await self.circuit.failed(
            ticket, kind, str(exc), retry_after=exc.retry_after if exc.status else None
        )
        if down is not None:
            raise down from None

"""A claimed turn that cannot go on now goes back to its queue, to be taken again later.

- `retry_or_fail`: the model failed, or the turn ran out of time; a try is counted,
  and the turn comes back after a backoff until the agent's retries are spent;
- `wait_for_provider`: the provider's circuit is open; no try is counted;
- `wait_for_capacity`: the provider's shared limits keep the turn back; no try counted;
- `give_back`: the store failed under the turn; no try counted, no error stored.

Each stores the run's new state and returns an `Delivered` holding the message to send
again; `resend` sends it after the outcome's countdown.
"""

from __future__ import annotations

import logging
import time

from relayq import ModelError
from relayq.circuit import ProviderDown, outage_countdown
from relayq.ratelimit import Throttled
from relayq.retry import backoff
from store import Claim, StaleClaim, StoreUnavailable
from tasks.broker.circuit import circuit_for, since_text
from tasks.deliveries import Delivered, TaskRef
from tasks.hooks import TurnOutcome
from tasks.runner.alone import ProcessDied
from tasks.runner.runtime import Runtime
from tasks.runner.turn.failed import fail_turn, stored_error
from tasks.settings import MAX_COUNTDOWN

__all__ = [
    "back_after_death",
    "give_back",
    "resend",
    "retry_or_fail",
    "wait_for_capacity",
    "wait_for_provider",
]

# The turn's log, whichever of its modules writes to it.
log = logging.getLogger("tasks.runner.turn.task")


async def retry_or_fail(rt: Runtime, claim: Claim, exc: ModelError | TimeoutError) -> Delivered:
    """Send the turn again after a backoff, or fail the run: the error is not retryable,
    or the agent's retries are spent (raises `TurnFailed`)."""
    if isinstance(exc, ProviderDown):
        return await wait_for_provider(rt, claim, exc)
    retryable = isinstance(exc, TimeoutError) or (isinstance(exc, ModelError) and exc.retryable)
    error = stored_error(exc)
    agent = rt.known_agent(claim.agent)
    if retryable and claim.attempts >= rt.settings.retries_of(agent):
        error = f"gave up after {claim.attempts + 1} tries: {error}"
        retryable = False
    if not retryable:
        await fail_turn(rt, claim, error, exc)
    retry_after = exc.retry_after if isinstance(exc, ModelError) else None
    countdown = backoff(
        claim.attempts, retry_after, base=rt.settings.turns.retry_base.total_seconds()
    )
    queue = agent.queue if agent is not None else None
    row = await rt.store.retry_turn(claim, error=error, countdown=countdown, queue=queue)
    summary = f"retry {claim.attempts + 1} in {countdown:.1f} s: {error}"
    return Delivered(TurnOutcome.RETRY, summary, countdown, resend=row)


async def give_back(rt: Runtime, claim: Claim, exc: StoreUnavailable) -> Delivered:
    """The store failed under the turn: once it answers again, the run goes back to its
    queue, with no try counted and no error stored."""
    log.warning("run %s: %s; the turn is given back once the store answers", claim.run_id, exc)
    return await _back(rt, claim, f"given back: the store was unavailable ({exc.reason})")


async def back_after_death(rt: Runtime, claim: Claim, died: ProcessDied, where: str) -> Delivered:
    """The process that ran the turn `where` alone died (`tasks.runner.alone`): the run goes back
    to its queue at once, the death counted against the turn."""
    log.error(
        "run %s: %s running %s; the run goes back to its queue, the death counted (%d of %d)",
        claim.run_id,
        died,
        where,
        claim.crashes + 1,
        rt.settings.turns.crash_limit,
    )
    return await _back(rt, claim, f"given back: {died}", died=True)


async def _back(rt: Runtime, claim: Claim, summary: str, *, died: bool = False) -> Delivered:
    """The run back in its queue, once the store answers, to be sent again at once."""
    try:
        row = await rt.patiently(
            rt.store.requeue_turn, claim, countdown=0.0, queue=_queue_of(rt, claim), died=died
        )
    except StaleClaim:
        # The turn's last write went through after all (its answer was lost), or the
        # sweeper freed the run meanwhile: its next message is on its way.
        return Delivered(TurnOutcome.SKIPPED, "skipped: lost the claim")
    return Delivered(TurnOutcome.GIVEN_BACK, summary, 0.0, resend=row)


# -- provider circuits: a turn whose provider is down goes back to its queue without spending
# a try, until the circuit closes (it is woken then) or RELAYQ_PROVIDER_OUTAGE_LIMIT. -------


async def wait_for_provider(rt: Runtime, claim: Claim, exc: ProviderDown) -> Delivered:
    """Send the turn again once its provider may answer; fail the run (raises `TurnFailed`)
    once it has waited RELAYQ_PROVIDER_OUTAGE_LIMIT."""
    circuit = circuit_for(rt.settings)
    wait = await circuit.waiting(exc.key, claim.run_id, claim.batch_id, probing=exc.probing)
    waited = 0.0 if wait is None else time.time() - wait.since
    limit = rt.settings.providers.outage_limit.total_seconds()
    if waited >= limit:
        error = (
            f"provider {exc.provider} down since {since_text(exc.opened_at)} "
            f"({exc.kind or 'outage'}); the run waited {waited:.0f} s for it, the limit "
            f"(RELAYQ_PROVIDER_OUTAGE_LIMIT) is {limit:g} s"
            + (f"; last error: {exc.error}" if exc.error else "")
        )
        await fail_turn(rt, claim, error, exc)
    probing = wait is not None and wait.probing
    countdown = outage_countdown(
        exc.retry_in,
        waited,
        rt.settings.providers.probe_every.total_seconds(),
        limit,
        probing=probing,
    )
    row = await rt.store.requeue_turn(claim, countdown=countdown, queue=_queue_of(rt, claim))
    if wait is None or not await circuit.still_waiting(exc.key, claim.run_id):
        countdown = 0.0  # closed (and its runs woken) while this turn went back
    return Delivered(
        TurnOutcome.WAITING,
        f"waiting on provider {exc.provider} since {since_text(exc.opened_at)}: "
        f"again in {countdown:.1f} s",
        countdown,
        resend=row,
    )


# -- provider limits: a turn whose provider has no capacity for longer than it may wait
# in place goes back to its queue; no failed try is counted, no error stored. --------------


async def wait_for_capacity(rt: Runtime, claim: Claim, exc: Throttled) -> Delivered:
    """Send the turn again when its provider's limits may let it through."""
    countdown = min(exc.retry_in, MAX_COUNTDOWN)
    row = await rt.store.requeue_turn(claim, countdown=countdown, queue=_queue_of(rt, claim))
    summary = f"waiting for {exc.provider} ({exc.reason}): again in {countdown:.1f} s"
    return Delivered(TurnOutcome.WAITING, summary, countdown, resend=row)


async def resend(rt: Runtime, task: TaskRef | None, outcome: Delivered) -> None:
    """Send the turn again after the outcome's backoff, if it says to: as a retry of the
    same task on a worker."""
    row, countdown = outcome.resend, outcome.retry_in or 0.0
    if row is None:
        return
    if task is None:
        await rt.dispatch([row])
    else:
        # Re-sent as a retry of the same task (same id, retries + 1), as Celery's own
        # retry does; the outbox row stands in case this send is lost.
        retry = task.task.signature_from_request(
            task.request,
            row.args,
            {},
            queue=row.queue,
            countdown=countdown,
            retries=task.request.retries + 1,
            # Flower's label for the turn, as the first send had it (`tasks.broker.publish`).
            argsrepr=row.label,
            kwargsrepr="{}",
        )
        await rt.store.call(retry.apply_async)
        await rt.dispatch.mark([row])


def _queue_of(rt: Runtime, claim: Claim) -> str | None:
    """The queue of the run's agent (None: the run's last, as the store keeps it)."""
    agent = rt.known_agent(claim.agent)
    return agent.queue if agent is not None else None

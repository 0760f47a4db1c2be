"""`relayq.run_turn`: one model turn of one run, claimed, run and persisted.

    claim (compare-and-swap on the run's version)
      -> take_turn (the model's reply is saved before any tool runs; each
         finished tool call goes to the ledger)
      -> one transaction: the turn's messages, the run's new state, and the
         next message in the outbox
      -> publish the outbox

The turn is a coroutine on the process's event loop; see `tasks.runtime`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, NoReturn

from celery import Task, shared_task
from celery.exceptions import Retry

from relayq import (
    InProcessRequest,
    InProcessResponse,
    ModelError,
    RelayqError,
    Request,
    RunCancelled,
    ToolResult,
    Usage,
)
from relayq import transcript as tx
from relayq.agents import Agent, AgentError
from relayq.budgets import Budget, Spent, next_call, overrun
from relayq.circuit import ProviderDown, outage_countdown
from relayq.loop import Journal, Turn, take_turn
from relayq.model import Model
from relayq.pricing import cost_of
from relayq.ratelimit import Throttled
from relayq.relay import relay_calls_of
from relayq.retry import backoff
from store import (
    Charge,
    Claim,
    StaleClaim,
    StoreUnavailable,
    claim_turn,
    fail_run,
    finish_cancelled,
    finish_turn,
    ledger_get,
    ledger_start,
    list_requests,
    requeue_turn,
    retry_turn,
    save_reply,
)
from store.budgets import Gate, budget_gate
from store.ledger import LedgerEntry, ledger_put_all
from store.outbox import TURN_TASK
from tasks.circuit import circuit_for, since_text
from tasks.deliveries import Outcome, TaskRef
from tasks.failures import failure_report
from tasks.hooks import (
    RATE_LIMITED,
    ModelCalled,
    ModelCalling,
    RequestOpened,
    RunHooks,
    RunSettled,
    ToolRan,
    ToolStarting,
    TurnEnded,
    TurnOutcome,
    TurnStarted,
    provider_of,
)
from tasks.limiter import limited_model
from tasks.runtime import Runtime
from tasks.settings import MAX_COUNTDOWN, Settings

__all__ = [
    "Outcome",
    "TaskRef",
    "TurnFailed",
    "drive_turn",
    "run_turn",
]  # the first two: tasks.deliveries

log = logging.getLogger(__name__)


class TurnFailed(RelayqError):
    """The run failed in this turn; the error is stored on the run."""

    def __init__(self, run_id: str, error: str) -> None:
        super().__init__(run_id, error)
        self.run_id = run_id
        self.error = error

    def __str__(self) -> str:
        return f"run {self.run_id} failed: {self.error}"


class StoreJournal(Journal):
    """The turn's progress in the store: the reply before tools, each tool outcome after it.

    It is also the turn's cancel flag: every write reads the run's flag in the
    same transaction, so boundaries see a cancel without a query of their own.

    What a crash could not lose is written with the turn's end instead of on its
    own: a reply that runs no tool of ours (its final text, its relay calls), and
    the outcome of a call that finished with no other call of the turn running.
    Between either and the turn's end nothing runs but the loop's own code, so
    a turn taken over redoes the same as it would have; and a turn saves a
    transaction, or two.
    """

    def __init__(
        self,
        rt: Runtime,
        claim: Claim,
        *,
        runs_tool: Callable[[str], bool] = lambda name: True,
        price: Callable[[Usage], float | None] = lambda usage: None,
        charge_batch: str | None = None,
        hooks: tuple[RunHooks, ...] = (),
    ) -> None:
        self.rt = rt
        self.claim = claim
        self.hooks = hooks
        """The agent's own hooks, after the runtime's."""
        self.runs_tool = runs_tool
        """Whether a call of this name runs a tool of ours (not a relay tool, not unknown)."""
        self.price = price
        """What a reply's usage cost (None: no price)."""
        self.charge_batch = charge_batch
        self.cancelled = False
        self._fresh: int | None = None
        self.stored = claim.messages
        """The transcript as the store holds it now."""
        self.charge: Charge | None = None
        """The reply's spending, when the reply is left for the turn's end to write."""
        self.entries: list[LedgerEntry] = []
        """Outcomes left for the turn's end (or the next call's start) to record."""
        self._running = 0
        self._started: dict[tuple[int, str, str], float] = {}

    def is_set(self) -> bool:
        return self.cancelled

    async def model_replied(self, messages: list[dict[str, Any]]) -> None:
        usage = tx.usage_in(messages[-1])
        cost = self.price(usage) or 0.0
        calls = messages[-1].get("tool_calls") or []
        if not any(self.runs_tool(c["function"]["name"]) for c in calls):
            self.charge = Charge(usage, cost, self.charge_batch)
            return
        self.cancelled = await self.rt.io(
            save_reply,
            self.rt.db,
            self.claim,
            messages,
            cost=cost,
            charge_batch=self.charge_batch,
        )
        self._fresh = len(messages) - 1
        self.stored = list(messages)

    async def recorded(self, at: int, call_id: str, attempt: str) -> ToolResult | Request | None:
        if at == self._fresh and not attempt:
            return None  # the reply was made in this very turn: nothing can be recorded yet
        return await self.rt.io(ledger_get, self.rt.db, self.claim.run_id, at, call_id, attempt)

    async def starting(self, at: int, call_id: str, attempt: str) -> int:
        # What finished before this call starts is kept first: the call may kill the worker.
        await self.flush()
        self._running += 1
        await self.rt.hooks.emit(
            "before_tool", ToolStarting(self.claim.run_id, self.claim.agent, call_id), self.hooks
        )
        self._started[at, call_id, attempt] = time.perf_counter()
        if at == self._fresh and not attempt:
            return 1  # counted when the reply was saved
        return await self.rt.io(ledger_start, self.rt.db, self.claim.run_id, at, call_id, attempt)

    async def record(
        self, at: int, call_id: str, attempt: str, outcome: ToolResult | Request
    ) -> None:
        self._running -= 1
        self.entries.append(LedgerEntry(at, call_id, attempt, outcome))
        if self._running > 0:
            await self.flush()  # another call still runs, and may kill the worker
        started = self._started.pop((at, call_id, attempt), None)
        if isinstance(outcome, ToolResult) and started is not None:
            ran = ToolRan(
                self.claim.run_id,
                self.claim.agent,
                call_id,
                outcome.is_error,
                time.perf_counter() - started,
            )
            await self.rt.hooks.emit("after_tool", ran, self.hooks)

    async def flush(self) -> None:
        """Record the outcomes left for later now."""
        if self.entries:
            entries, self.entries = self.entries, []
            self.cancelled = await self.rt.io(
                ledger_put_all, self.rt.db, self.claim.run_id, entries
            )


def _missing_relay_tools(rt: Runtime, claim: Claim, relay_names: frozenset[str]) -> list[str]:
    names: set[str] = set()
    for stored in list_requests(rt.db, status=None, run_id=claim.run_id, kind="tool_call"):
        names.update(c.name for c in relay_calls_of(stored.request))
    return sorted(names - relay_names)


async def _turn(
    rt: Runtime, claim: Claim, agent: Agent, gate: Gate
) -> tuple[Turn, StoreJournal, str]:
    toolkit = await agent.toolkit()
    digest = toolkit.digest()
    if claim.tools_digest not in (None, digest):
        missing = await rt.io(_missing_relay_tools, rt, claim, toolkit.relay_names)
        if missing:
            raise AgentError(
                f"agent {agent.name!r} no longer declares relay tool(s) {', '.join(missing)} "
                f"that run {claim.run_id} used; it cannot resume",
                agent.name,
            )

    def runs_tool(name: str) -> bool:
        tool = toolkit.get(name)
        return tool is not None and not tool.is_relay

    journal = StoreJournal(
        rt,
        claim,
        runs_tool=runs_tool,
        price=lambda usage: cost_of(agent, usage),
        charge_batch=gate.charge_batch,
        hooks=agent.hooks,
    )
    time_limit = _time_limit(rt.settings, agent)
    async with asyncio.timeout(time_limit):
        turn = await take_turn(
            claim.messages,
            toolkit,
            # Under the provider's shared limits, if it sets any (`tasks.limiter`).
            _watched(rt, claim, agent, limited_model(rt.settings, agent, time_limit)),
            run_id=claim.run_id,
            max_turns=agent.max_turns,
            system_prompt=agent.system_prompt,
            model_name=agent.model_name,
            journal=journal,
            cancel=journal,
        )
    return turn, journal, digest


def _time_limit(settings: Settings, agent: Agent) -> float:
    """Seconds the turn may take: the agent's limit, and never past a few seconds
    before Celery's soft time limit (RELAYQ_TURN_TIME_LIMIT, see `workers.config`).

    The soft limit interrupts a prefork body wherever it is: the turn's coroutine
    is cancelled halfway, no retry is sent, and the task fails. The turn's own
    deadline comes first, so a turn that runs too long is a TimeoutError, retried
    with backoff (`_retry_or_fail`) on either pool. The margin pays for what runs
    before the deadline starts (the claim) and after it (the retry's store write
    and send): 5 s, or a quarter of a limit under 20 s.
    """
    soft = settings.turn_time_limit
    return min(settings.time_limit_of(agent), soft - min(5.0, soft / 4))


async def drive_turn(rt: Runtime, task: TaskRef | None, run_id: str, version: int) -> Outcome:
    """Run one turn; returns what happened.

    The store may go away under it. The claim is asked for until the store answers
    (asking again is safe: a claim whose commit was lost is freed by this worker's
    sweeper). A store call that fails after the claim ends the turn there: once the
    store answers, the run goes back to its queue (`_give_back`), and its next turn
    takes up what this one stored (the reply, the tools' outcomes in the ledger).

    The runtime's hooks, and the agent's, see the claimed turn start and end
    (`tasks.hooks`), then the request it opened and the run settling, if it did.
    """
    task_id = task.id if task is not None else None
    # Counted from before the claim is asked for: the sweeper frees a claim of this
    # worker that no task works on (`store.maintenance`).
    with rt.working.on(run_id):
        claim = await rt.patiently(
            claim_turn,
            rt.db,
            run_id,
            version,
            task_id=task_id,
            lease=rt.settings.worker_timeout,
            worker=rt.worker_id,
            worker_timeout=rt.settings.worker_timeout,
            kept=rt.transcripts.take(run_id, version),
            heartbeats_steady=rt.heartbeat.steady,
        )
        if claim is None:
            return Outcome(TurnOutcome.SKIPPED, "skipped: stale or duplicate message")
        hooks = _agent_hooks(rt, claim.agent)
        header = getattr(task.request, "traceparent", None) if task is not None else None
        started = time.perf_counter()
        await rt.hooks.emit(
            "before_turn",
            TurnStarted(
                claim.run_id, claim.agent, claim.turns + 1, claim.attempts + 1, task_id, header
            ),
            hooks,
        )
        outcome: Outcome | None = None
        error: str | None = None
        failed = False
        try:
            try:
                outcome = await _drive(rt, claim)
                await _resend(rt, task, outcome)
            except StoreUnavailable as exc:
                error = type(exc).__name__
                outcome = await _give_back(rt, claim, exc)
                await _resend(rt, task, outcome)
        except BaseException as exc:
            error = type(exc).__name__
            failed = isinstance(exc, TurnFailed)  # stored on the run: it settled
            raise
        finally:
            seconds = time.perf_counter() - started
            await _ended(rt, claim, hooks, outcome, error, seconds, failed=failed)
        return outcome


async def _ended(
    rt: Runtime,
    claim: Claim,
    hooks: tuple[RunHooks, ...],
    outcome: Outcome | None,
    error: str | None,
    seconds: float,
    *,
    failed: bool,
) -> None:
    """Tell the hooks how the claimed turn ended: the request it opened, the turn's end,
    and the run settling (a failed run too)."""
    kind = outcome.kind if outcome is not None else TurnOutcome.FAILED
    pending = outcome.turn.pending if outcome is not None and outcome.turn is not None else None
    if pending is not None:
        opened = RequestOpened(claim.run_id, claim.agent, pending.id, pending.kind)
        await rt.hooks.emit("after_request_opened", opened, hooks)
    ended = TurnEnded(
        claim.run_id,
        claim.agent,
        claim.turns + 1,
        kind,
        seconds,
        pending.id if pending is not None else None,
        error,
    )
    await rt.hooks.emit("after_turn", ended, hooks)
    if failed or (outcome is not None and kind.settles):
        settled = RunSettled(claim.run_id, claim.agent, kind.value)
        await rt.hooks.emit("after_run_settled", settled, hooks)


def _agent_hooks(rt: Runtime, name: str) -> tuple[RunHooks, ...]:
    agent = rt.known_agent(name)
    return agent.hooks if agent is not None else ()


def _watched(rt: Runtime, claim: Claim, agent: Agent, model: Model) -> Model:
    """`model`, with the hooks told of each call (`ModelCalling`, `ModelCalled`)."""
    name, provider = agent.model_name, provider_of(agent)
    hooks: tuple[RunHooks, ...] = agent.hooks

    async def call(request: InProcessRequest) -> InProcessResponse:
        await rt.hooks.emit(
            "before_model_call", ModelCalling(claim.run_id, agent.name, provider, name), hooks
        )
        started = time.perf_counter()
        result: str | None = "error"
        reply: InProcessResponse | None = None
        status: int | None = None
        error: str | None = None
        try:
            reply = await model(request)
            result = "ok"
            return reply
        except Throttled:
            result = None  # kept back by the provider's limits: no call made
            raise
        except ProviderDown as exc:
            if not exc.called:
                result = None  # kept back by the provider's open circuit
            error = type(exc).__name__
            raise
        except ModelError as exc:
            status = exc.status
            if exc.status in RATE_LIMITED:
                result = "rate_limited"
            error = type(exc).__name__
            raise
        except BaseException as exc:
            error = type(exc).__name__
            raise
        finally:
            usage = reply.usage if reply is not None else None
            called = ModelCalled(
                claim.run_id,
                agent.name,
                provider,
                name,
                result,
                time.perf_counter() - started,
                usage,
                cost_of(agent, usage) if usage is not None else None,
                status,
                error,
            )
            await rt.hooks.emit("after_model_call", called, hooks)

    return call


async def _drive(rt: Runtime, claim: Claim) -> Outcome:
    run_id = claim.run_id
    if claim.crashes > rt.settings.crash_limit:
        # The turn keeps killing its worker.
        error = f"the worker died {claim.crashes} times running this turn; giving up"
        await _fail(rt, claim, error)
    try:
        agent = rt.agent(claim.agent)
        gate = await _budget_gate(rt, claim, agent)
        if gate.verdict != "go":
            return _stopped_by_budget(gate)
        turn, journal, digest = await _turn(rt, claim, agent, gate)
        outbox = await rt.io(
            finish_turn,
            rt.db,
            claim,
            # What is already stored (the reply, if saved) is not written again.
            journal.stored,
            turn,
            tools_digest=digest,
            request_ttl=agent.request_ttl,
            on_expiry=agent.on_expiry,
            queue=agent.queue,
            charge=journal.charge,
            entries=journal.entries,
        )
    except StaleClaim:
        return Outcome(TurnOutcome.SKIPPED, "skipped: lost the claim")
    except StoreUnavailable:
        raise  # not the run's failure: `drive_turn` gives the run back
    except RunCancelled:
        await rt.io(finish_cancelled, rt.db, claim)
        return Outcome(TurnOutcome.CANCELLED, "cancelled")
    except Throttled as exc:
        return await _wait_for_capacity(rt, claim, exc)
    except (ModelError, TimeoutError) as exc:
        return await _retry_or_fail(rt, claim, exc)
    except Exception as exc:
        await _fail(rt, claim, _describe(exc), exc)
    if turn.status == "next":
        # The next turn's message claims the run at the version this one leaves it at.
        rt.transcripts.keep(run_id, claim.version + 1, turn.messages)
    await rt.dispatch(outbox)
    return Outcome(TurnOutcome(turn.status), turn.status, turn=turn)


async def _fail(
    rt: Runtime, claim: Claim, error: str, exc: BaseException | None = None
) -> NoReturn:
    """Fail the run saying `error`, and log it once: one line and the user's frames of
    `exc` (`tasks.failures`); Celery adds no traceback of its own (`throws`)."""
    await rt.io(fail_run, rt.db, claim, error)
    log.error("%s", failure_report(claim.run_id, claim.agent, claim.turns + 1, error, exc))
    raise TurnFailed(claim.run_id, error) from None


async def _retry_or_fail(rt: Runtime, claim: Claim, exc: Exception) -> Outcome:
    if isinstance(exc, ProviderDown):
        return await _wait_for_provider(rt, claim, exc)
    retryable = isinstance(exc, TimeoutError) or (isinstance(exc, ModelError) and exc.retryable)
    error = _describe(exc)
    agent = rt.known_agent(claim.agent)
    if retryable and claim.attempts >= rt.settings.retries_of(agent):
        error = f"gave up after {claim.attempts + 1} tries: {error}"
        retryable = False
    if not retryable:
        await _fail(rt, claim, error, exc)
    retry_after = exc.retry_after if isinstance(exc, ModelError) else None
    countdown = backoff(claim.attempts, retry_after, base=rt.settings.retry_base)
    queue = agent.queue if agent is not None else None
    row = await rt.io(retry_turn, rt.db, claim, error=error, countdown=countdown, queue=queue)
    summary = f"retry {claim.attempts + 1} in {countdown:.1f} s: {error}"
    return Outcome(TurnOutcome.RETRY, summary, countdown, resend=row)


async def _give_back(rt: Runtime, claim: Claim, exc: StoreUnavailable) -> Outcome:
    """The store failed under the turn: once it answers again, the run goes back to its
    queue, with no try counted and no error stored."""
    log.warning("run %s: %s; the turn is given back once the store answers", claim.run_id, exc)
    agent = rt.known_agent(claim.agent)
    queue = agent.queue if agent is not None else None
    try:
        row = await rt.patiently(requeue_turn, rt.db, claim, countdown=0.0, queue=queue)
    except StaleClaim:
        # The turn's last write went through after all (its answer was lost), or the
        # sweeper freed the run meanwhile: its next message is on its way.
        return Outcome(TurnOutcome.SKIPPED, "skipped: lost the claim")
    summary = f"given back: the store was unavailable ({exc.reason})"
    return Outcome(TurnOutcome.GIVEN_BACK, summary, 0.0, resend=row)


# -- provider circuits: a turn whose provider is down goes back to its queue without spending
# a try, until the circuit closes (it is woken then) or RELAYQ_PROVIDER_OUTAGE_LIMIT. -------


async def _wait_for_provider(rt: Runtime, claim: Claim, exc: ProviderDown) -> Outcome:
    circuit = circuit_for(rt.settings)
    wait = await circuit.waiting(exc.key, claim.run_id, claim.batch_id, probing=exc.probing)
    waited = 0.0 if wait is None else time.time() - wait.since
    limit = rt.settings.provider_outage_limit
    if waited >= limit:
        error = (
            f"provider {exc.provider} down since {since_text(exc.opened_at)} "
            f"({exc.kind or 'outage'}); the run waited {waited:.0f} s for it, the limit "
            f"(RELAYQ_PROVIDER_OUTAGE_LIMIT) is {limit:g} s"
            + (f"; last error: {exc.error}" if exc.error else "")
        )
        await _fail(rt, claim, error, exc)
    probing = wait is not None and wait.probing
    countdown = outage_countdown(
        exc.retry_in, waited, rt.settings.provider_probe_every, limit, probing=probing
    )
    agent = rt.known_agent(claim.agent)
    queue = agent.queue if agent is not None else None
    row = await rt.io(requeue_turn, rt.db, claim, countdown=countdown, queue=queue)
    if wait is None or not await circuit.still_waiting(exc.key, claim.run_id):
        countdown = 0.0  # closed (and its runs woken) while this turn went back
    return Outcome(
        TurnOutcome.WAITING,
        f"waiting on provider {exc.provider} since {since_text(exc.opened_at)}: "
        f"again in {countdown:.1f} s",
        countdown,
        resend=row,
    )


# -- provider limits: a turn whose provider has no capacity for longer than it may wait
# in place goes back to its queue; no failed try is counted, no error stored. --------------


async def _wait_for_capacity(rt: Runtime, claim: Claim, exc: Throttled) -> Outcome:
    countdown = min(exc.retry_in, MAX_COUNTDOWN)
    agent = rt.known_agent(claim.agent)
    queue = agent.queue if agent is not None else None
    row = await rt.io(requeue_turn, rt.db, claim, countdown=countdown, queue=queue)
    summary = f"waiting for {exc.provider} ({exc.reason}): again in {countdown:.1f} s"
    return Outcome(TurnOutcome.WAITING, summary, countdown, resend=row)


async def _resend(rt: Runtime, task: TaskRef | None, outcome: Outcome) -> None:
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
            # Flower's label for the turn, as the first send had it (`tasks.publish`).
            argsrepr=row.label,
            kwargsrepr="{}",
        )
        await rt.io(retry.apply_async)
        await rt.dispatch.mark([row])


# -- budgets: before the model is called, the run's budget and its batch's are checked
# (`store.budgets`); past one, the run asks for more, waits for its batch's answer, or ends. --


async def _budget_gate(rt: Runtime, claim: Claim, agent: Agent) -> Gate:
    own = Budget.from_wire(claim.budget)
    guess = next_call(claim.messages, lambda usage: cost_of(agent, usage))
    spent = Spent(claim.total_tokens, claim.cost)
    if overrun(own or agent.budget, spent, guess, "run") is None and not claim.batch_budgeted:
        # Within its own budget, and no batch's to keep to: no write, no lock on the batch.
        return Gate("go")
    return await rt.io(
        budget_gate,
        rt.db,
        claim.run_id,
        claim.version,
        default=agent.budget,
        next_call=guess,
    )


def _stopped_by_budget(gate: Gate) -> Outcome:
    kind = TurnOutcome.OVER_BUDGET if gate.verdict == "ended" else TurnOutcome.PENDING
    return Outcome(kind, f"{kind.value}: {gate.detail}")


def _describe(exc: BaseException) -> str:
    """The run's stored (and logged) error: the type and a short, redacted message.

    Never the whole text: a database error's holds the SQL and its parameters
    (the transcript, an answer), and any message may hold a key.
    """
    from relayq.limits import describe_error

    if isinstance(exc, TimeoutError):
        return "the turn ran out of time"
    return describe_error(exc)


# `throws`: a failed run is logged by `_fail`, and Celery's record of the task's end is one
# line, without the traceback of relayq's and Celery's own frames (still a task failure).
@shared_task(
    name=TURN_TASK, bind=True, acks_late=True, reject_on_worker_lost=True, throws=(TurnFailed,)
)
def run_turn(self: Task, run_id: str, version: int) -> str:
    """One model turn of run `run_id`, if the run is still at `version`."""
    rt = Runtime.current(self.app)
    outcome = rt.wait(drive_turn(rt, TaskRef(self, self.request), run_id, version))
    if outcome.retry_in is not None:
        # `_retry_or_fail` has re-sent this task (same id, retries + 1): Celery hears
        # of it as of its own `Task.retry`, so the `task_retry` signal and the
        # task-retried event fire, and the message is acknowledged.
        raise Retry(outcome.summary, when=outcome.retry_in)
    return outcome.summary

"""`relayq.run_turn`: one model turn of one run, claimed, run and persisted.

A turn passes through three names:

    run_turn (the Celery task)
      -> drive_turn (the driver: claim, gate, step, persist, what comes next)
         -> relayq.loop.take_turn (the step: the model's reply, then its tool calls)

`drive_turn`:

    claim (compare-and-swap on the run's version)
      -> the budget gate (`tasks.runner.turn.budgets`)
      -> take_turn (the model's reply is saved before any tool runs; each finished
         tool call goes to the ledger: `tasks.runner.turn.journal`)
      -> one transaction: the turn's messages, the run's new state, and the
         next message in the outbox
      -> publish the outbox

A turn that cannot go on goes back to its queue (`tasks.runner.turn.waits`) or fails its run
(`tasks.runner.turn.failed`); the hooks hear of it all (`tasks.runner.turn.hooks`). The turn is a
coroutine on the process's event loop; see `tasks.runner.runtime`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import asdict
from datetime import timedelta
from typing import Any

from celery import Task, shared_task
from celery.exceptions import Retry

from relayq import ModelError, RunCancelled, Toolkit
from relayq import transcript as tx
from relayq.agents import Agent, AgentError
from relayq.loop import RunFacts, Turn, take_turn
from relayq.pricing import cost_of
from relayq.ratelimit import Throttled
from relayq.relay import relay_calls_of
from store import (
    Claim,
    OutboxRow,
    StaleClaim,
    StoreUnavailable,
    list_requests,
)
from store.budgets import Gate
from store.outbox import TURN_TASK
from tasks.broker.limiter import limited_model
from tasks.deliveries import Delivered, TaskRef
from tasks.hooks import TurnOutcome
from tasks.runner.alone import AloneError, ProcessDied
from tasks.runner.process import current_runtime
from tasks.runner.runtime import Runtime
from tasks.runner.turn.budgets import check_budget, stopped_by_budget
from tasks.runner.turn.failed import OutOfTime, TurnFailed, fail_turn, stored_error
from tasks.runner.turn.gatekeeper import StoreGatekeeper
from tasks.runner.turn.hooks import TurnReport, watched
from tasks.runner.turn.journal import StoreJournal
from tasks.runner.turn.waits import (
    back_after_death,
    give_back,
    resend,
    retry_or_fail,
    wait_for_capacity,
)
from tasks.settings import Settings

__all__ = [
    "Delivered",
    "TaskRef",
    "TurnFailed",
    "drive_turn",
    "run_turn",
    "turn_alone",
]  # the first two: tasks.deliveries; TurnFailed: tasks.runner.turn.failed

log = logging.getLogger(__name__)


# `throws`: a failed run is logged by `fail_turn`, and Celery's record of the task's end is
# one line, without the traceback of relayq's and Celery's own frames (still a task failure).
@shared_task(
    name=TURN_TASK, bind=True, acks_late=True, reject_on_worker_lost=True, throws=(TurnFailed,)
)
def run_turn(self: Task, run_id: str, version: int) -> str:
    """One model turn of run `run_id`, if the run is still at `version`."""
    rt = current_runtime(self.app)
    outcome = rt.loop.wait(drive_turn(rt, TaskRef(self, self.request), run_id, version))
    if outcome.retry_in is not None:
        # The driver has re-sent this task (same id, retries + 1: `resend`): Celery hears
        # of it as of its own `Task.retry`, so the `task_retry` signal and the
        # task-retried event fire, and the message is acknowledged.
        raise Retry(outcome.summary, when=outcome.retry_in)
    return outcome.summary


async def drive_turn(rt: Runtime, task: TaskRef | None, run_id: str, version: int) -> Delivered:
    """Run one turn; returns what happened.

    The store may go away under it. The claim is asked for until the store answers
    (asking again is safe: a claim whose commit was lost is freed by this worker's
    sweeper). A store call that fails after the claim ends the turn there: once the
    store answers, the run goes back to its queue (`give_back`), and its next turn
    takes up what this one stored (the reply, the tools' outcomes in the ledger).

    A suspect run's turn (its worker died holding it beside other turns) runs in a
    process of the worker's own (`tasks.runner.alone`), where this worker runs several turns
    in one process. The runtime's hooks, and the agent's, see the claimed turn start
    and end (`tasks.runner.turn.hooks`), then the request it opened and the run settling, if
    it did.
    """
    # Counted from before the claim is asked for: the sweeper frees a claim of this
    # worker that no task works on (`store.maintenance`).
    with rt.working.on(run_id):
        claim = await _claim(rt, task, run_id, version)
        if claim is None:
            return Delivered(TurnOutcome.SKIPPED, "skipped: stale or duplicate message")
        with rt.doing(f"a turn of run {run_id} (agent {claim.agent})"):
            if _runs_apart(rt, claim):
                outcome = await _apart(rt, task, claim)
            else:
                task_id, traceparent = _delivery(task)
                outcome = await _claimed(rt, claim, task_id=task_id, traceparent=traceparent)
        try:
            await resend(rt, task, outcome)
        except StoreUnavailable as exc:
            # The message is in the outbox: the sweeper sends it once the store is back.
            log.warning("run %s: the turn's retry is left to the sweeper: %s", run_id, exc)
        return outcome


def _delivery(task: TaskRef | None) -> tuple[str | None, str | None]:
    return (task.id, task.traceparent) if task is not None else (None, None)


def _runs_apart(rt: Runtime, claim: Claim) -> bool:
    """A suspect turn, on a worker that runs it in a process of its own: unless its crashes
    have failed it already (that needs no process)."""
    return claim.suspect and rt.alone is not None and claim.crashes < rt.settings.turns.crash_limit


async def _apart(rt: Runtime, task: TaskRef | None, claim: Claim) -> Delivered:
    """The turn, run alone in a child process (`tasks.runner.alone`, `turn_alone`) under this
    worker's claim; a death of that process is counted against the turn."""
    assert rt.alone is not None
    task_id, traceparent = _delivery(task)
    job = {"claim": asdict(claim), "task_id": task_id, "traceparent": traceparent}
    try:
        reply = await rt.alone.run(job, timeout=rt.settings.turns.time_limit.total_seconds())
    except ProcessDied as died:
        return await back_after_death(rt, claim, died, _where(claim))
    if "failed" in reply:
        raise TurnFailed(claim.run_id, reply["failed"])
    if "error" in reply:
        raise AloneError(claim.run_id, reply["error"])
    return Delivered.from_wire(reply)


async def turn_alone(rt: Runtime, job: dict[str, Any]) -> dict[str, Any]:
    """In the child process (`workers.alone`): the turn `job` names, under the claim its
    worker holds; what came of it as JSON (`Delivered.wire`), or the run's failure."""
    claim = Claim(**job["claim"])
    try:
        with rt.doing(f"a turn of run {claim.run_id} (agent {claim.agent}), alone"):
            outcome = await _claimed(
                rt, claim, task_id=job["task_id"], traceparent=job["traceparent"]
            )
    except TurnFailed as exc:
        return {"failed": exc.error}
    except Exception as exc:  # told to the worker, which fails the task as it would its own
        log.exception("run %s: the turn met an error", claim.run_id)
        return {"error": type(exc).__name__}
    return outcome.wire()


async def _claimed(
    rt: Runtime, claim: Claim, *, task_id: str | None, traceparent: str | None
) -> Delivered:
    """The turn, once claimed: its outcome, the retry to send (if any) in it."""
    async with TurnReport(rt, claim, task_id=task_id, traceparent=traceparent) as report:
        try:
            if claim.crashes >= rt.settings.turns.crash_limit:
                # The turn keeps killing its worker.
                await fail_turn(rt, claim, _crashed_error(claim))
            try:
                agent = rt.agent(claim.agent)
                gate = await check_budget(rt, claim, agent)
                if gate.verdict != "go":
                    report.outcome = stopped_by_budget(gate)
                    return report.outcome  # nothing to send: the run waits, or ended
                toolkit, digest = await _resumable_toolkit(rt, claim, agent)
                journal = _journal(rt, claim, agent, toolkit, gate)
                time_limit = _time_limit(rt.settings, agent)
                deadline = asyncio.timeout(time_limit)
                try:
                    async with deadline:
                        # Under the provider's shared limits (`tasks.broker.limiter`).
                        model = limited_model(rt.settings, agent, time_limit)
                        turn = await take_turn(
                            claim.messages,
                            toolkit,
                            watched(rt, claim, agent, model),
                            run_id=claim.run_id,
                            max_turns=agent.max_turns,
                            system_prompt=agent.system_prompt,
                            model_name=agent.model_name,
                            journal=journal,
                            cancel=journal,
                            tool_timeout=_seconds(agent.tool_timeout),
                            facts=RunFacts(
                                agent=claim.agent,
                                conversation_id=claim.conversation_id,
                                started_by=claim.started_by,
                                gatekeeper=StoreGatekeeper(rt),
                            ),
                        )
                except TimeoutError:
                    if not deadline.expired():
                        raise
                    raise OutOfTime(journal.running) from None  # its error names the tools
                outbox = await _finish(rt, claim, agent, journal, turn, digest)
            except StoreUnavailable:
                raise  # not the run's failure: given back below
            except Exception as exc:
                outcome = await _outcome_of_error(rt, claim, exc)
            else:
                outcome = await _send_next(rt, claim, turn, outbox)
            report.outcome = outcome
        except StoreUnavailable as exc:
            report.error = type(exc).__name__
            outcome = report.outcome = await give_back(rt, claim, exc)
        return outcome


def _crashed_error(claim: Claim) -> str:
    """`the tool `x` (call c1) killed its worker 3 times, in turn 2; giving up`."""
    calls = _running_calls(claim)
    if calls is None:
        return f"the worker died {claim.crashes} times running turn {claim.turns + 1}; giving up"
    return f"{calls} killed its worker {claim.crashes} times, in turn {claim.turns}; giving up"


def _where(claim: Claim) -> str:
    """`turn 3, in the tool `x` (call c1)`, or `turn 4` while it waited on its model."""
    calls = _running_calls(claim)
    return f"turn {claim.turns + 1}" if calls is None else f"turn {claim.turns}, in {calls}"


def _running_calls(claim: Claim) -> str | None:
    """`the tool `x` (call c1)`: the calls of the turn's saved reply with no result yet, one
    of which was running when its process died (the reply is saved before tools run);
    None when there is none: the turn was waiting on its model."""
    todo = [slot.call for slot in tx.slots(claim.messages) if slot.state == "todo"]
    if not todo:
        return None
    named = ", ".join(f"`{call.name}` (call {call.id})" for call in todo)
    return f"the tool {named}" if len(todo) == 1 else f"one of the tools {named}"


async def _claim(rt: Runtime, task: TaskRef | None, run_id: str, version: int) -> Claim | None:
    """The run, claimed for this turn; None if it is no longer at `version`, or taken.

    Asked for until the store answers: a claim whose commit was lost is freed by this
    worker's sweeper.
    """
    return await rt.patiently(
        rt.store.claim_turn,
        run_id,
        version,
        task_id=task.id if task is not None else None,
        lease=rt.settings.recovery.worker_timeout,
        worker=rt.worker_id,
        worker_timeout=rt.settings.recovery.worker_timeout,
        kept=rt.transcripts.take(run_id, version),
        heartbeats_steady=rt.heartbeat.steady,
        alone=rt.runs_alone,
        apart=rt.alone is not None,
    )


async def _resumable_toolkit(rt: Runtime, claim: Claim, agent: Agent) -> tuple[Toolkit, str]:
    """The agent's toolkit and its digest; AgentError if the run used a relay tool the agent
    no longer declares (its request could never be answered)."""
    toolkit = await agent.toolkit()
    digest = toolkit.digest()
    if claim.tools_digest not in (None, digest):
        if agent.mcp_servers:
            log.warning(
                "run %s resumes with other tools than it started with: agent %r's MCP "
                "servers (%s) list other tools now",
                claim.run_id,
                agent.name,
                ", ".join(s.label for s in agent.mcp_servers),
            )
        missing = await rt.store.call(_missing_relay_tools, rt, claim, toolkit.relay_names)
        if missing:
            raise AgentError(
                f"agent {agent.name!r} no longer declares relay tool(s) {', '.join(missing)} "
                f"that run {claim.run_id} used; it cannot resume",
                agent.name,
            )
    return toolkit, digest


def _missing_relay_tools(rt: Runtime, claim: Claim, relay_names: frozenset[str]) -> list[str]:
    names: set[str] = set()
    for stored in list_requests(rt.db, status=None, run_id=claim.run_id, kind="tool_call"):
        names.update(c.name for c in relay_calls_of(stored.request))
    return sorted(names - relay_names)


def _journal(rt: Runtime, claim: Claim, agent: Agent, toolkit: Toolkit, gate: Gate) -> StoreJournal:
    """The turn's journal, priced as the agent's model is, charged to the gate's batch."""

    def runs_tool(name: str) -> bool:
        tool = toolkit.get(name)
        return tool is not None and not tool.is_relay

    return StoreJournal(
        rt,
        claim,
        runs_tool=runs_tool,
        price=lambda usage: cost_of(agent, usage),
        charge_batch=gate.charge_batch,
        hooks=agent.hooks,
    )


def _seconds(limit: timedelta | None) -> float | None:
    return None if limit is None else limit.total_seconds()


def _time_limit(settings: Settings, agent: Agent) -> float:
    """Seconds the turn may take: the agent's limit, and never past a few seconds
    before Celery's soft time limit (RELAYQ_TURN_TIME_LIMIT, see `workers.config`).

    The soft limit interrupts a prefork body wherever it is: the turn's coroutine
    is cancelled halfway, no retry is sent, and the task fails. The turn's own
    deadline comes first, so a turn that runs too long is a TimeoutError, retried
    with backoff (`retry_or_fail`) on either pool. The margin pays for what runs
    before the deadline starts (the claim) and after it (the retry's store write
    and send): 5 s, or a quarter of a limit under 20 s.
    """
    soft = settings.turns.time_limit.total_seconds()
    return min(settings.time_limit_of(agent), soft - min(5.0, soft / 4))


async def _finish(
    rt: Runtime, claim: Claim, agent: Agent, journal: StoreJournal, turn: Turn, digest: str
) -> list[OutboxRow]:
    """Store the turn's end in one transaction: its messages, the run's new state, and the
    next message in the outbox (returned, to be sent)."""
    return await rt.store.finish_turn(
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


async def _send_next(rt: Runtime, claim: Claim, turn: Turn, outbox: list[OutboxRow]) -> Delivered:
    """Send the messages the finished turn left in the outbox (the next turn's, if any)."""
    if turn.status == "next":
        # The next turn's message claims the run at the version this one leaves it at.
        rt.transcripts.keep(claim.run_id, claim.version + 1, turn.messages)
    await rt.dispatch(outbox)
    return Delivered(TurnOutcome(turn.status), turn.status, turn=turn)


async def _outcome_of_error(rt: Runtime, claim: Claim, exc: Exception) -> Delivered:
    """What an error in the turn makes of it: skipped, cancelled, waiting or retried; any
    other error fails the run (raises `TurnFailed`)."""
    if isinstance(exc, StaleClaim):
        return Delivered(TurnOutcome.SKIPPED, "skipped: lost the claim")
    if isinstance(exc, RunCancelled):
        await rt.store.finish_cancelled(claim)
        return Delivered(TurnOutcome.CANCELLED, "cancelled")
    if isinstance(exc, Throttled):
        return await wait_for_capacity(rt, claim, exc)
    if isinstance(exc, ModelError | TimeoutError):
        return await retry_or_fail(rt, claim, exc)
    await fail_turn(rt, claim, stored_error(exc), exc)

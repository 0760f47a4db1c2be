"""One turn of the agent loop, from a transcript to what happened.

`take_turn` is the whole engine. If the open turn has outstanding tool calls
(a saved model reply whose tools never ran, an approved tool to call again)
it finishes them; else it halts if a call waits on the host, or calls the
model once and runs the tools it asked for. The in-process client loops over
it; the durable worker runs it once per task and persists what it returns.

`apply_answer` is the other half: it puts the host's answer into the
transcript, matched by call id, so that the next `take_turn` carries on.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, TypeAlias

from relayq import transcript as tx
from relayq._errors import (
    AnswerMismatch,
    RequestClosed,
    ResumeError,
    RunCancelled,
    UnknownRequest,
)
from relayq._toolkit import Toolkit
from relayq._tools import Tool, ToolContext
from relayq._types import Answer, Request, ToolResult
from relayq.approvals import decision_of, is_approval
from relayq.model import InProcessRequest, InProcessToolCall, Model
from relayq.policies import Gatekeeper
from relayq.relay import (
    RelayCall,
    declined_result,
    is_relay_request,
    relay_calls_of,
    relay_request,
    relay_results_of,
)

__all__ = [
    "Cancel",
    "Journal",
    "RunFacts",
    "Turn",
    "TurnStatus",
    "WaitFor",
    "apply_answer",
    "take_turn",
]

TurnStatus = Literal["next", "done", "pending", "incomplete"]
WaitFor: TypeAlias = Callable[[Request], "Answer | Awaitable[Answer]"]


class Cancel(Protocol):
    """Anything with `is_set()`: `threading.Event`, `asyncio.Event`, a database flag."""

    def is_set(self) -> bool: ...


@dataclass(frozen=True, kw_only=True)
class Turn:
    """What one `take_turn` did."""

    status: TurnStatus
    """`next`: tools ran, call the model again; `done`: final text; `pending`: waits on
    the host; `incomplete`: `max_turns` reached."""
    messages: list[dict[str, Any]]
    """The whole transcript after the turn."""
    pending: Request | None = None
    """The request to surface when `status == "pending"`: the first in call order."""
    text: str = ""
    model_called: bool = False


class Journal:
    """Where a turn records its progress, so that a repeated turn resumes instead of redoing.

    The base class keeps nothing, which is right in-process. The durable worker
    saves the model's reply before any tool runs, and keeps a ledger of tool
    outcomes keyed by where the call was made (`at`, the index of its assistant
    message: providers reuse call ids across turns), the call id and the attempt
    (the id of the answer a tool was called again with, or "" for its first call).
    """

    async def model_replied(self, messages: list[dict[str, Any]]) -> None:
        """The model's reply is the last message; tools have not run yet."""

    async def recorded(self, at: int, call_id: str, attempt: str) -> ToolResult | Request | None:
        """What an earlier try of this call produced, if it finished."""
        return None

    async def starting(self, at: int, call_id: str, attempt: str, *, tool: str = "") -> int:
        """The call of `tool` is about to run (it has no recorded outcome), in the task
        that runs it; returns which execution this is, 1 for the first: `ctx.attempt`."""
        return 1

    async def record(
        self, at: int, call_id: str, attempt: str, outcome: ToolResult | Request
    ) -> None:
        """A tool call finished with `outcome`."""


@dataclass(frozen=True, kw_only=True)
class RunFacts:
    """What a tool's context says of the run beyond its id (`ToolContext`)."""

    agent: str = ""
    conversation_id: str | None = None
    started_by: str | None = None
    gatekeeper: Gatekeeper = field(default_factory=Gatekeeper)


@dataclass(frozen=True, kw_only=True)
class _Ctx:
    toolkit: Toolkit
    run_id: str
    facts: RunFacts
    journal: Journal
    wait_for: WaitFor | None
    cancel: Cancel | None
    tool_timeout: float | None

    transcript: list[dict[str, Any]]
    replies: int
    """The run's replies when the turn began (`tx.survey`)."""
    began: int
    """The transcript's length then: a reply at or past it is this turn's own."""

    def turn_of(self, slot: tx.Slot) -> int:
        """The run's turn number of the reply that made the slot's call.

        A slot's call is the open turn's, the run's latest reply: the replies counted
        when the turn began, and this turn's own if the call is in it. Counting them
        again would walk a conversation of 800 turns at each of its calls.
        """
        return self.replies + (1 if slot.at >= self.began else 0)

    async def ask(self, request: Request) -> Answer:
        assert self.wait_for is not None
        answer = self.wait_for(request)
        if inspect.isawaitable(answer):
            answer = await answer
        if not isinstance(answer, Answer):
            raise ResumeError(f"wait_for returned {type(answer).__name__}, not an Answer")
        _check_echo(request, answer)
        return answer


async def take_turn(
    messages: list[dict[str, Any]],
    toolkit: Toolkit,
    model: Model,
    *,
    run_id: str,
    max_turns: int = 10,
    system_prompt: str | None = None,
    model_name: str = "in-process",
    journal: Journal | None = None,
    wait_for: WaitFor | None = None,
    cancel: Cancel | None = None,
    tool_timeout: float | None = None,
    facts: RunFacts | None = None,
) -> Turn:
    """Take one turn of the run whose transcript is `messages` (not modified); a local
    tool's call without a timeout of its own is given up on after `tool_timeout` s;
    `facts` are what its tools' contexts say of the run."""
    messages = list(messages)
    start, turns = tx.survey(messages)  # one pass over the transcript, however long
    if start < 0:
        raise ResumeError("the transcript has no user message to run")
    ctx = _Ctx(
        toolkit=toolkit,
        run_id=run_id,
        facts=facts or RunFacts(),
        journal=journal or Journal(),
        wait_for=wait_for,
        cancel=cancel,
        tool_timeout=tool_timeout,
        transcript=messages,
        replies=turns,
        began=len(messages),
    )
    outstanding = [s for s in tx.slots(messages) if s.state in ("todo", "answered")]
    if outstanding:
        # Finishing an earlier turn (its reply was saved, or a tool was approved)
        # is this turn's whole work: one model call per turn, never two.
        _check_cancel(cancel, run_id)
        await _settle_all(messages, outstanding, ctx)
        return _halt(messages) or Turn(status="next", messages=messages)
    halted = _halt(messages)
    if halted is not None:
        return halted
    text = tx.final_text(messages)
    if text is not None:
        return Turn(status="done", messages=messages, text=text)
    if turns >= max_turns:
        return Turn(status="incomplete", messages=messages)
    _check_cancel(cancel, run_id)
    full = _with_system(system_prompt, messages)
    reply = await model(
        InProcessRequest(
            messages=tx.for_model(full),
            tools=toolkit.to_openai(),
            model=model_name,
            transcript=full,
        )
    )
    calls = [_call_of(c) for c in reply.tool_calls]
    messages.append(tx.assistant_message(reply.content, calls, reply.usage))
    await ctx.journal.model_replied(messages)
    if not calls:
        return Turn(status="done", messages=messages, text=reply.content, model_called=True)
    _check_cancel(cancel, run_id)
    await _settle_all(messages, tx.slots(messages), ctx)
    halted = _halt(messages)
    return halted or Turn(status="next", messages=messages, model_called=True)


def apply_answer(
    messages: list[dict[str, Any]],
    pending: Request,
    answer: Answer,
    *,
    partial: bool = False,
    now: datetime | None = None,
) -> list[dict[str, Any]]:
    """The transcript with `answer` applied to the halted request `pending`.

    Relay results replace their placeholders, matched by call id. A declined
    request gives each of its calls an error result. An approved non-relay
    suspension is marked answered, and the next turn calls its tool again with
    `ctx.answer`. With `partial`, calls left without a result stay pending.
    Raises ResumeError, leaving `messages` untouched, when the answer does not fit.
    """
    stored = _waiting(messages, pending, answer, now or datetime.now(UTC))
    out = list(messages)
    held = [
        s
        for s in tx.slots(messages)
        if s.state == "pending" and s.request is not None and s.request.id == stored.id
    ]
    if is_relay_request(stored):
        open_ids = {s.call.id for s in held}
        open_calls = [c.model_dump(mode="json") for c in relay_calls_of(stored) if c.id in open_ids]
        narrowed = stored.model_copy(update={"data": {**stored.data, "calls": open_calls}})
        results = relay_results_of(narrowed, answer, partial=partial)
        for s in held:
            if s.call.id in results and s.index is not None:
                out[s.index] = tx.tool_message(s.call.id, results[s.call.id])
        return out
    for s in held:
        assert s.index is not None
        if answer.ok:
            out[s.index] = tx.answered_placeholder(out[s.index], answer)
        else:
            out[s.index] = tx.tool_message(s.call.id, declined_result(answer))
    return out


def _waiting(
    messages: list[dict[str, Any]], pending: Request, answer: Answer, moment: datetime
) -> Request:
    """The request as the transcript keeps it, once `answer` is known to fit it."""
    if not messages:
        raise ResumeError("cannot resume an empty transcript", pending.id)
    tx.check(messages)
    _check_echo(pending, answer)
    waiting = {r.id: r for r in tx.open_requests(messages)}
    if not waiting:
        raise ResumeError("the transcript has no halted turn to resume", pending.id)
    stored = waiting.get(pending.id)
    if stored is None:
        raise UnknownRequest(
            pending.id,
            f"request {pending.id} is not waiting in this transcript; "
            f"waiting: {', '.join(waiting)}",
        )
    if stored.expires_at is not None and moment >= stored.expires_at:
        raise RequestClosed(
            stored.id, "expired", f"request {stored.id} expired at {stored.expires_at.isoformat()}"
        )
    if is_approval(stored):
        decision_of(stored, answer)  # a decision, never free text: refused before any change
    return stored


def _check_echo(pending: Request, answer: Answer) -> None:
    if answer.id != pending.id:
        raise AnswerMismatch(
            f"answer id {answer.id!r} does not echo the pending request id {pending.id!r}",
            pending.id,
        )


def _check_cancel(cancel: Cancel | None, run_id: str) -> None:
    if cancel is not None and cancel.is_set():
        raise RunCancelled(run_id)


def _halt(messages: list[dict[str, Any]]) -> Turn | None:
    waiting = tx.open_requests(messages)
    if not waiting:
        return None
    return Turn(status="pending", messages=messages, pending=waiting[0])


def _with_system(system_prompt: str | None, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not system_prompt:
        return messages
    return [{"role": "system", "content": system_prompt}, *messages]


def _call_of(call: InProcessToolCall) -> tx.Call:
    args = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)
    return tx.Call(id=call.id, name=call.name, arguments=args)


_Resolved: TypeAlias = "ToolResult | Request | RelayCall"


async def _settle_all(messages: list[dict[str, Any]], work: list[tx.Slot], ctx: _Ctx) -> None:
    """Run the slots' calls concurrently; write their results in call order."""
    try:
        # A TaskGroup, not gather: if one call is cancelled, its siblings stop too.
        async with asyncio.TaskGroup() as group:
            running = [group.create_task(_resolve(s, ctx)) for s in work]
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None
    outcomes = [t.result() for t in running]
    relayed = [o for o in outcomes if isinstance(o, RelayCall)]
    # Every relay call of the turn rides one request, in call order.
    folded = relay_request(relayed) if relayed else None
    for slot, outcome in zip(work, outcomes, strict=True):
        if isinstance(outcome, ToolResult):
            msg = tx.tool_message(slot.call.id, outcome)
        elif isinstance(outcome, RelayCall):
            assert folded is not None
            msg = tx.placeholder(slot.call.id, folded)
        else:
            msg = tx.placeholder(slot.call.id, outcome)
        if slot.index is None:
            messages.append(msg)
        else:
            messages[slot.index] = msg


async def _resolve(slot: tx.Slot, ctx: _Ctx) -> _Resolved:
    call = slot.call
    tool = ctx.toolkit.get(call.name)
    if tool is None:
        return ToolResult.error(f"Unknown tool: {call.name}")
    args = _parse_arguments(call)
    if isinstance(args, ToolResult):
        return args
    if tool.is_relay:
        relay_call = RelayCall(id=call.id, name=call.name, input=args, arguments=call.arguments)
        if ctx.wait_for is None:
            return relay_call
        request = relay_request([relay_call])
        return relay_results_of(request, await ctx.ask(request))[call.id]
    return await _invoke(tool, slot, args, ctx)


async def _invoke(
    tool: Tool, slot: tx.Slot, args: dict[str, Any], ctx: _Ctx
) -> ToolResult | Request:
    """Call a tool once (or, with wait_for, until it stops asking), through the ledger."""
    call, answer, turn = slot.call, slot.answer, ctx.turn_of(slot)
    while True:
        attempt = answer.id if answer is not None else ""
        outcome = await ctx.journal.recorded(slot.at, call.id, attempt)
        if outcome is None:
            _check_cancel(ctx.cancel, ctx.run_id)
            tool_ctx = ToolContext(
                run_id=ctx.run_id,
                call_id=call.id,
                tool_name=call.name,
                base_dir=ctx.toolkit.base_dir,
                answer=answer,
                turn=turn,
                attempt=await ctx.journal.starting(slot.at, call.id, attempt, tool=call.name),
                agent=ctx.facts.agent,
                conversation_id=ctx.facts.conversation_id,
                started_by=ctx.facts.started_by,
                gatekeeper=ctx.facts.gatekeeper,
            )
            outcome = await tool.invoke(args, tool_ctx, timeout=ctx.tool_timeout)
            await ctx.journal.record(slot.at, call.id, attempt, outcome)
        if isinstance(outcome, ToolResult) or ctx.wait_for is None:
            return outcome
        answer = await ctx.ask(outcome)
        if not answer.ok:
            return declined_result(answer)


def _parse_arguments(call: tx.Call) -> dict[str, Any] | ToolResult:
    try:
        args = json.loads(call.arguments) if call.arguments.strip() else {}
    except json.JSONDecodeError as exc:
        return ToolResult.error(f"arguments for {call.name} are not valid JSON: {exc}")
    if not isinstance(args, dict):
        return ToolResult.error(f"arguments for {call.name} must be a JSON object")
    return args

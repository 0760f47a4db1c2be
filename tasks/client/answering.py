"""A client's answers and decisions (`DurableClient.submit_answer`, `submit_many`,
`decide_many`): parsed and checked, taken by the store, told to the hooks, and their
messages sent. (A worker then applies each: `tasks.runner.turn.answers`.)"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

from pydantic import ValidationError

from relayq import Answer, AnswerMismatch, BulkRefused, Request
from relayq.approvals import is_approval
from relayq.grants import GrantTerms
from relayq.replies import Decided, Declined, answer_to
from store import OutboxRow
from store.answers import Accepted
from store.audit import Decider
from tasks.hooks import Hooks, RequestDecided
from tasks.settings import Settings
from tasks.storeio import StoreDoor

__all__ = ["Answering", "answer_echoing", "answer_of"]


def answer_of(answer: Answer | dict[str, Any]) -> Answer:
    """The answer parsed by the one strict parser (the HTTP API's too); ResumeError if malformed."""
    try:
        return Answer.model_validate(answer)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "answer"
        given = answer.get("id") if isinstance(answer, dict) else None
        request_id = given if isinstance(given, str) else None
        raise AnswerMismatch(f"malformed answer: {where}: {first['msg']}", request_id) from None


def answer_echoing(pending: Request | dict[str, Any], answer: Answer | dict[str, Any]) -> Answer:
    """The answer, parsed, to the request a run waits on; AnswerMismatch unless it echoes
    the request's id."""
    request = Request.model_validate(pending)
    reply = answer_of(answer)
    if reply.id != request.id:
        raise AnswerMismatch(
            f"answer id {reply.id!r} does not echo the pending request id {request.id!r}",
            request.id,
        )
    return reply


class Answering:
    """Takes one client's answers and decisions (the verbs' docstrings say what each does)."""

    def __init__(
        self,
        settings: Settings,
        store: StoreDoor,
        hooks: Hooks,
        publish: Callable[[Iterable[OutboxRow]], Awaitable[int]],
    ) -> None:
        self.settings = settings
        self.store = store
        self.hooks = hooks
        self.publish = publish

    async def submit(
        self,
        answer: Answer | dict[str, Any],
        *,
        answered_by: str | None,
        partial: bool,
        decider: Decider | None,
        decision: bool,
        grant: GrantTerms | None = None,
    ) -> str:
        """`DurableClient.submit_answer`: returns the run id."""
        reply = answer_of(answer)
        since = time.time_ns()
        accepted = await self.store.accept_answer(
            reply,
            answered_by=answered_by,
            partial=partial,
            decider=decider,
            decision=decision,
            max_bytes=self.settings.max_answer_bytes,
            grant=grant,
        )
        via = decider.via if decider is not None else "python"
        await self.decided([(reply, accepted)], since=since, via=via)
        await self.publish(accepted.outbox)
        return accepted.run_id

    async def submit_many(
        self,
        answers: Sequence[Answer | dict[str, Any]],
        *,
        decider: Decider,
        revisions: Mapping[str, int] | None,
    ) -> list[str]:
        """`DurableClient.submit_many`: returns the runs that resume."""
        replies = [answer_of(a) for a in answers]
        seen = revisions or {}
        since = time.time_ns()
        accepted = await self.store.accept_many(
            [(r, seen.get(r.id)) for r in replies],
            decider=decider,
            max_bytes=self.settings.max_answer_bytes,
        )
        await self.decided(zip(replies, accepted, strict=True), since=since, via=decider.via)
        await self.publish([row for a in accepted for row in a.outbox])
        return [a.run_id for a in accepted if a.complete]

    async def decide_many(
        self,
        revisions: Mapping[str, int | None],
        decision: Literal["approve", "decline"],
        *,
        decider: Decider,
        reason: str | None,
    ) -> list[str]:
        """`DurableClient.decide_many`: returns the runs that resume."""
        if decision == "decline" and not (reason or "").strip():
            raise BulkRefused(tuple((rid, "declining takes a reason") for rid in revisions))
        stored = await self.store.get_requests(list(revisions))
        refused = [
            (rid, f"no request {rid}" if rid not in stored else f"{rid} is not an approval")
            for rid in revisions
            if rid not in stored or (decision == "approve" and not is_approval(stored[rid].request))
        ]
        if refused:
            raise BulkRefused(tuple(refused))
        answers = [
            answer_to(rid, Decided("approve") if decision == "approve" else Declined(reason or ""))
            for rid in revisions
        ]
        known = {rid: seen for rid, seen in revisions.items() if seen is not None}
        return await self.submit_many(answers, decider=decider, revisions=known)

    async def decided(
        self, decisions: Iterable[tuple[Answer, Accepted]], *, since: int, via: str
    ) -> None:
        """Tell the hooks of each answer the store took (`RequestDecided`)."""
        for reply, accepted in decisions:
            event = RequestDecided(
                reply.id, accepted.run_id, reply.ok, accepted.complete, via, since
            )
            await self.hooks.emit(event)

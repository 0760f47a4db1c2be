"""Answering a request over HTTP: the body, and the checks that pick 404, 409, 413 or 422.

The store's `accept_answer` is the judge (a ResumeError changes nothing); the
checks here only tell the caller *why* an answer was refused: no such request
(404), a request that takes no more answers (409), an answer over the size
limit (413), or one that does not fit its calls or holds what the store cannot
keep (422). The body is parsed by the same strict `Answer` model the Python
client uses: `"ok": "yes"` is refused by both.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

from api._errors import http_error
from relayq import Answer, ResumeError
from relayq.approvals import is_approval
from relayq.grants import GrantTerms
from relayq.relay import RelayResult, relay_calls_of
from relayq.replies import Data, Decided, Declined, Reply, Results, answer_to
from store import Decider, StoredRequest
from store.grants import GrantRefused
from tasks import DurableClient

__all__ = ["AnswerBody", "answer_request", "approval", "stored_request"]


class AnswerBody(BaseModel):
    """An answer to one request: approve with `output` (or `results`, or raw `data`),
    or decline with `ok: false` and a `reason`."""

    model_config = ConfigDict(extra="forbid")

    ok: StrictBool = True
    """False declines: every call of the request gets an error result carrying `reason`."""
    output: str | None = None
    """The single call's output (the `{output}` shorthand)."""
    results: list[RelayResult] | None = Field(default=None, min_length=1)
    """One result per call id: `[{id, output, isError?}]`."""
    data: dict[str, Any] | None = None
    """The answer's data as is, for requests of other kinds."""
    reason: str | None = None
    """Why the request is declined."""
    partial: StrictBool = False
    """Keep the request open until every call has a result."""

    @field_validator("results", mode="before")
    @classmethod
    def _strict_results(cls, value: Any) -> Any:
        # RelayResult alone would read `"isError": "yes"` as true; the Answer model refuses it.
        Answer.model_validate({"id": "", "data": {"results": value}})
        return value

    @model_validator(mode="after")
    def _one_shape(self) -> AnswerBody:
        given = [k for k in ("output", "results", "data") if getattr(self, k) is not None]
        if not self.ok:
            if given:
                raise ValueError(f"a declined answer (ok: false) takes no {', '.join(given)}")
            if self.partial:
                raise ValueError("a declined answer cannot be partial")
        else:
            if len(given) != 1:
                raise ValueError("ok: true takes exactly one of output, results, data")
            if self.reason is not None:
                raise ValueError("reason goes with ok: false")
        self.answer("")  # the Answer model's own checks, at once: a 422, not a 500 later
        return self

    def answer(self, request_id: str) -> Answer:
        """The wire Answer (`relayq.replies.answer_to`)."""
        return answer_to(request_id, self.reply())

    def reply(self) -> Reply:
        if not self.ok:
            return Declined(self.reason or "declined")
        if self.results is not None:
            return Results(self.results)
        if self.output is not None:
            return Data({"output": self.output})
        return Data(self.data or {})


async def stored_request(client: DurableClient, request_id: str) -> StoredRequest:
    """The stored request, or 404."""
    try:
        return await client.request(request_id)
    except ResumeError as exc:
        raise http_error(exc) from exc


async def answer_request(
    client: DurableClient,
    answer: Answer,
    *,
    decider: Decider,
    partial: bool = False,
    decision: bool = False,
    grant: GrantTerms | None = None,
) -> StoredRequest:
    """Submit the answer (given as a decision, with `decision`; making a standing grant
    with it, with `grant`); 403, 404, 409, 413 or 422 from the refusal's type (nothing
    changed)."""
    try:
        await client.submit_answer(
            answer, partial=partial, decider=decider, decision=decision, grant=grant
        )
    except (ResumeError, GrantRefused) as exc:
        raise http_error(exc) from exc
    return await stored_request(client, answer.id)


def approval(stored: StoredRequest, output: str) -> Answer:
    """The inbox's approve button: for an approval, the typed decision (never the text);
    else `output` for every call of the request."""
    reply: Reply
    calls = relay_calls_of(stored.request)
    if is_approval(stored.request):
        reply = Decided("approve")
    elif len(calls) > 1:
        reply = Results([RelayResult(id=c.id, output=output) for c in calls])
    else:
        reply = Data({"output": output})
    return answer_to(stored.request.id, reply)

"""Relay tools: a schema the model sees, executed by the host.

When the model calls a relay tool the run suspends with one Request of kind
`tool_call`; `data.calls` lists every relay call of that assistant turn in
call order, each with the provider's call id. The host runs them and answers
with `relay_answer` (one result per call id) or, for a single call,
`answer_output`.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field, StrictBool, ValidationError

from relayq._errors import AnswerMismatch
from relayq._tools import Tool
from relayq._types import Answer, Request, ToolResult, WireModel

__all__ = [
    "RELAY_KIND",
    "RelayCall",
    "RelayResult",
    "answer_declined",
    "answer_output",
    "is_relay_request",
    "relay_answer",
    "relay_calls_of",
    "relay_request",
    "relay_results_of",
    "relay_tool",
]

RELAY_KIND = "tool_call"


class RelayCall(WireModel):
    """One relayed call: wire shape `{id, name, input, arguments}`."""

    id: str
    """The provider's call id; results are matched on it."""
    name: str
    input: dict[str, Any] = Field(default_factory=dict)
    """The parsed arguments."""
    arguments: str = "{}"
    """The arguments exactly as the model sent them."""


class RelayResult(WireModel):
    """The host's result for one relayed call: wire shape `{id, output, isError}`."""

    id: str
    output: str
    is_error: StrictBool = False
    """True or false only, at every door (`"yes"`, `1` and `"false"` are refused)."""


def relay_tool(name: str, description: str, schema: dict[str, Any] | None = None) -> Tool:
    """A tool with a schema and no behaviour; calling it suspends the run for the host."""
    if schema is None:
        return Tool(name=name, description=description)
    return Tool(name=name, description=description, schema=schema)


def is_relay_request(req: Request) -> bool:
    return req.kind == RELAY_KIND


def relay_calls_of(req: Request) -> list[RelayCall]:
    """The calls a relay request carries, in call order; empty for other kinds."""
    if not is_relay_request(req):
        return []
    return [RelayCall.model_validate(c) for c in req.data.get("calls", [])]


def relay_request(calls: list[RelayCall], *, request_id: str | None = None) -> Request:
    """The one Request that carries a turn's relay calls."""
    names = ", ".join(c.name for c in calls)
    prompt = f"Run {names} for the agent" if len(calls) == 1 else f"Run {len(calls)} calls: {names}"
    data = {"calls": [c.model_dump(mode="json") for c in calls]}
    if request_id is None:
        return Request(kind=RELAY_KIND, prompt=prompt, data=data)
    return Request(id=request_id, kind=RELAY_KIND, prompt=prompt, data=data)


def relay_answer(request_id: str, results: list[RelayResult]) -> Answer:
    """Answer every call of a relay request, each result keyed by its call id."""
    return Answer(
        id=request_id, ok=True, data={"results": [r.model_dump(mode="json") for r in results]}
    )


def answer_output(request_id: str, output: str, is_error: bool = False) -> Answer:
    """The shorthand answer to a request that carries a single call (or a question)."""
    return Answer(id=request_id, ok=True, data={"output": output, "isError": is_error})


def answer_declined(request_id: str, reason: str = "declined") -> Answer:
    """Decline a request: each call it covers gets an error result with `reason`."""
    return Answer(id=request_id, ok=False, reason=reason)


def declined_result(answer: Answer) -> ToolResult:
    reason = answer.reason or "declined"
    return ToolResult.error(f"declined: {reason}")


def relay_results_of(
    req: Request, answer: Answer, *, partial: bool = False
) -> dict[str, ToolResult]:
    """Match an answer's results to the request's calls by id, never by position.

    Raises ResumeError for an unknown or repeated id, or a shorthand answer to a
    multi-call request. A call left without a result gets an error result,
    unless `partial`, where it is simply absent from the returned mapping.
    """
    calls = relay_calls_of(req)
    if not answer.ok:
        return {c.id: declined_result(answer) for c in calls}
    supplied = _supplied_results(req, calls, answer)
    known = {c.id for c in calls}
    out: dict[str, ToolResult] = {}
    for result in supplied:
        if result.id not in known:
            raise AnswerMismatch(
                f"answer to {req.id} has a result for unknown call id {result.id!r}; "
                f"the request's calls are {sorted(known)}",
                req.id,
                (result.id,),
            )
        if result.id in out:
            raise AnswerMismatch(
                f"answer to {req.id} has two results for call id {result.id!r}",
                req.id,
                (result.id,),
            )
        out[result.id] = ToolResult(output=result.output, is_error=result.is_error)
    if not partial:
        for c in calls:
            out.setdefault(c.id, ToolResult.error(f"no result supplied on resume for {c.name}"))
    return out


def _supplied_results(req: Request, calls: list[RelayCall], answer: Answer) -> list[RelayResult]:
    data = answer.data or {}
    if "results" in data:
        try:
            return [RelayResult.model_validate(r) for r in data["results"]]
        except (ValidationError, TypeError) as exc:
            raise AnswerMismatch(
                f"answer to {req.id}: data.results must be a list of "
                f"{{id, output, isError}}: {exc}",
                req.id,
            ) from exc
    if "output" in data:
        if len(calls) != 1:
            raise AnswerMismatch(
                f"answer to {req.id} uses the single-call shorthand data.output, but the "
                f"request carries {len(calls)} calls; answer each with data.results",
                req.id,
            )
        output = data["output"]
        text = output if isinstance(output, str) else json.dumps(output)
        return [RelayResult(id=calls[0].id, output=text, is_error=bool(data.get("isError")))]
    return []

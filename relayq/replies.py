"""One way to an Answer, whatever door it came in by.

A door (an HTTP body, an inbox form, an MCP input, a CLI flag, a host's lease result)
turns what it was given into one of these typed replies, and `answer_to` builds the
wire `Answer` from it through the one strict model. Whether the answer fits its
request (a decision for an approval, a result for each call) and whether it fits the
store (its size, its characters) is judged once, where it is stored
(`store.answers`), whichever door it came by.

    answer_to(request_id, Decided("approve"))
    answer_to(request_id, Decided("decline", reason="over budget"))
    answer_to(request_id, Results([RelayResult(id="c1", output="42")]))
    answer_to(request_id, Output("42"))          # a request of one call
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from relayq._types import Answer
from relayq.approvals import approve, decline, edit
from relayq.relay import RelayResult, answer_declined, answer_output, relay_answer

__all__ = ["Data", "Decided", "Declined", "Output", "Reply", "Results", "answer_to"]


@dataclass(frozen=True)
class Decided:
    """An approver's decision: approve, edit (with the new `arguments`) or decline (with
    a `reason`). ValueError for a decision and fields that do not go together."""

    decision: Literal["approve", "edit", "decline"]
    arguments: dict[str, Any] | None = None
    reason: str | None = None

    def __post_init__(self) -> None:
        if self.decision not in ("approve", "edit", "decline"):
            raise ValueError("decision must be approve, edit or decline")
        if (self.arguments is not None) != (self.decision == "edit"):
            raise ValueError("arguments go with decision 'edit', and only with it")
        if (self.reason is not None) != (self.decision == "decline"):
            raise ValueError("a reason goes with decision 'decline', and only with it")
        if self.decision == "decline" and not (self.reason or "").strip():
            raise ValueError("declining takes a reason")


@dataclass(frozen=True)
class Results:
    """A result for each of the relay calls named (all of a request's, or some of them
    for a partial answer)."""

    results: Sequence[RelayResult]


@dataclass(frozen=True)
class Output:
    """The one output of a request of a single call (the `{output}` shorthand)."""

    output: str
    is_error: bool = False


@dataclass(frozen=True)
class Data:
    """An answer's data as it is, for requests of other kinds (a question's reply)."""

    data: dict[str, Any]


@dataclass(frozen=True)
class Declined:
    """No answer: every call the request covers gets an error result with `reason`."""

    reason: str = "declined"


Reply = Decided | Results | Output | Data | Declined
"""What a door was given, typed."""


def answer_to(request_id: str, reply: Reply) -> Answer:
    """The wire Answer to `request_id` that `reply` gives."""
    match reply:
        case Decided(decision="approve"):
            return approve(request_id)
        case Decided(decision="edit", arguments=arguments):
            return edit(request_id, arguments or {})
        case Decided(reason=reason):
            return decline(request_id, reason or "")
        case Results(results=results):
            return relay_answer(request_id, list(results))
        case Output(output=output, is_error=is_error):
            return answer_output(request_id, output, is_error)
        case Data(data=data):
            return Answer(id=request_id, data=data)
        case Declined(reason=reason):
            return answer_declined(request_id, reason)

"""`relayq.replies`: one way from what a door was given to an `Answer`."""

from __future__ import annotations

import pytest

from relayq import Answer
from relayq.relay import RelayResult
from relayq.replies import Data, Decided, Declined, Output, Results, answer_to


@pytest.mark.parametrize(
    ("reply", "wire"),
    [
        (Decided("approve"), {"ok": True, "data": {"decision": "approve"}}),
        (
            Decided("edit", {"amount": 5}),
            {"ok": True, "data": {"decision": "edit", "arguments": {"amount": 5}}},
        ),
        (Decided("decline", reason="too much"), {"ok": False, "reason": "too much"}),
        (
            Results([RelayResult(id="c1", output="42", is_error=True)]),
            {"ok": True, "data": {"results": [{"id": "c1", "output": "42", "isError": True}]}},
        ),
        (Output("42"), {"ok": True, "data": {"output": "42", "isError": False}}),
        (Data({"by": "sue"}), {"ok": True, "data": {"by": "sue"}}),
        (Declined(), {"ok": False, "reason": "declined"}),
    ],
)
def test_each_reply_makes_its_answer(reply, wire):
    assert answer_to("req_1", reply) == Answer.model_validate({"id": "req_1", **wire})


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Decided("approve", {"a": 1}), "arguments go with decision 'edit'"),
        (lambda: Decided("edit"), "arguments go with decision 'edit'"),
        (lambda: Decided("approve", reason="why"), "a reason goes with decision 'decline'"),
        (lambda: Decided("decline", reason="  "), "declining takes a reason"),
        (lambda: Decided("maybe"), "decision must be approve, edit or decline"),  # type: ignore[arg-type]
    ],
)
def test_a_decision_whose_parts_do_not_go_together_is_refused_saying_why(make, message):
    with pytest.raises(ValueError, match=message):
        make()

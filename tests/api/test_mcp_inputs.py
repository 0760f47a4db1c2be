"""A run as an MCP task, and input responses as answers (`api.mcp._inputs`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from api.mcp._inputs import answer_of, input_requests, task_of
from relayq import Answer, Request
from relayq.approvals import APPROVAL_KIND
from relayq.relay import RelayCall, RelayResult, relay_answer, relay_request, relay_results_of
from store import StoredRequest

NOW = datetime(2026, 12, 6, tzinfo=UTC)


def stored(
    request: Request, answer: Answer | None = None, tool: str | None = None
) -> StoredRequest:
    return StoredRequest(
        request=request, run_id="run_1", agent="a", status="open", created_at=NOW,
        answer=answer, tool=tool,
    )  # fmt: skip


def two_calls() -> Request:
    calls = [
        RelayCall(id="c1", name="alpha", input={"x": 1}, arguments='{"x": 1}'),
        RelayCall(id="c2", name="beta", input={}, arguments="{}"),
    ]
    return relay_request(calls, request_id="req_1")


def accept(**content: Any) -> dict[str, Any]:
    return {"action": "accept", "content": content}


def test_each_relay_call_is_an_input_request_keyed_by_its_call_id_with_its_tool():
    asked = input_requests(stored(two_calls()), {"alpha": {"type": "object"}})

    assert set(asked.requests) == set(asked.details) == {"c1", "c2"}
    assert asked.requests["c1"] == {
        "method": "elicitation/create",
        "params": {"mode": "form", "message": 'Run alpha with {"x": 1}',
                   "requestedSchema": asked.requests["c1"]["params"]["requestedSchema"]},
    }  # fmt: skip
    assert asked.requests["c1"]["params"]["requestedSchema"]["required"] == ["output"]
    assert asked.meta["relayq/calls"]["c1"] == {
        "name": "alpha", "arguments": {"x": 1}, "schema": {"type": "object"},
    }  # fmt: skip


def test_a_call_with_a_result_is_asked_no_more():
    partial = relay_answer("req_1", [RelayResult(id="c1", output="done")])

    assert set(input_requests(stored(two_calls(), partial), {}).requests) == {"c2"}


def test_responses_become_one_answer_ignoring_unknown_and_answered_keys():
    partial = relay_answer("req_1", [RelayResult(id="c1", output="done")])
    responses = {"c1": accept(output="again"), "c2": accept(output="B", isError=True), "zz": {}}

    answer = answer_of(stored(two_calls(), partial), responses)

    assert answer is not None
    results = relay_results_of(two_calls(), answer, partial=True)
    assert {k: (r.output, r.is_error) for k, r in results.items()} == {"c2": ("B", True)}


def test_responses_to_nothing_asked_are_no_answer():
    assert answer_of(stored(two_calls()), {"zz": accept(output="x")}) is None


def test_a_declined_call_is_an_error_result():
    answer = answer_of(stored(two_calls()), {"c1": {"action": "decline"}})

    assert answer is not None
    result = relay_results_of(two_calls(), answer, partial=True)["c1"]
    assert (result.output, result.is_error) == ("declined by the client", True)


@pytest.mark.parametrize(
    ("response", "says"),
    [
        ({"action": "maybe"}, "must be an elicitation result"),
        ("text", "must be an elicitation result"),
        ({"action": "accept"}, "must carry content"),
        (accept(output=3), "must have a text output"),
    ],
)
def test_a_response_that_does_not_fit_is_refused(response: Any, says: str):
    with pytest.raises(ValueError, match=says):
        answer_of(stored(two_calls()), {"c1": response})


def approval() -> Request:
    data = {"arguments": {"service": "web"}, "schema": {"type": "object"}}
    return Request(id="req_2", kind=APPROVAL_KIND, prompt="Release web?", data=data)


@pytest.mark.parametrize(
    ("content", "data", "ok"),
    [
        ({"decision": "approve"}, {"decision": "approve"}, True),
        ({"decision": "edit", "arguments": '{"service": "api"}'},
         {"decision": "edit", "arguments": {"service": "api"}}, True),
        ({"decision": "decline", "reason": "not now"}, None, False),
    ],
)  # fmt: skip
def test_an_approval_is_one_input_request_whose_response_is_a_decision(
    content: dict[str, Any], data: dict[str, Any] | None, ok: bool
):
    asked = input_requests(stored(approval(), tool="release"), {})
    assert list(asked.requests) == ["req_2"]
    assert asked.details["req_2"]["name"] == "release"

    answer = answer_of(stored(approval()), {"req_2": accept(**content)})

    assert answer is not None
    assert (answer.ok, answer.data if ok else answer.reason) == (ok, data if ok else "not now")


def test_an_edit_whose_arguments_are_not_an_object_is_refused():
    with pytest.raises(ValueError, match="JSON object"):
        answer_of(stored(approval()), {"req_2": accept(decision="edit", arguments="[1]")})


def test_a_question_takes_a_json_object_or_a_text():
    question = Request(id="req_3", kind="approval", prompt="Deploy?", data={"service": "web"})

    as_data = answer_of(stored(question), {"req_3": accept(answer='{"by": "sue"}')})
    as_text = answer_of(stored(question), {"req_3": accept(answer="yes")})

    assert as_data is not None
    assert as_text is not None
    assert (as_data.data, as_text.data) == ({"by": "sue"}, {"output": "yes"})


@pytest.mark.parametrize(
    ("status", "task_status", "extra"),
    [
        ("queued", "working", {}),
        ("running", "working", {}),
        ("done", "completed", {"result": {"content": [{"type": "text", "text": "hi"}],
                                          "isError": False}}),
        ("failed", "failed", {"error": {"code": -32603, "message": "boom"}}),
        ("cancelled", "cancelled", {}),
    ],
)  # fmt: skip
def test_a_runs_status_is_its_tasks(status: str, task_status: str, extra: dict[str, Any]):
    task = task_of("run_1", status, created=NOW, updated=NOW, text="hi", error="boom")

    assert task["status"] == task_status
    assert task["ttlMs"] is None
    assert {k: task[k] for k in extra} == extra


def test_a_pending_run_is_input_required_with_its_questions():
    asked = input_requests(stored(two_calls()), {})

    task = task_of("run_1", "pending", created=NOW, updated=NOW, asked=asked)

    assert (task["status"], task["inputRequests"]) == ("input_required", asked.requests)
    assert task["_meta"] == {"relayq/calls": asked.details}


@pytest.mark.parametrize("flag", ["false", "true", 1, 0, None, "yes"])
def test_is_error_is_true_or_false_and_nothing_else(flag: object):
    with pytest.raises(ValueError, match="isError must be true or false"):
        answer_of(stored(two_calls()), {"c1": accept(output="x", isError=flag)})


def test_a_relay_result_is_error_is_a_strict_boolean_wherever_it_is_built():
    for flag in ("false", "yes", 1):
        with pytest.raises(ValueError, match=r"is_error|isError"):
            RelayResult.model_validate({"id": "c1", "output": "x", "isError": flag})


def test_an_approval_s_form_offers_only_the_decisions_its_policy_allows():
    request = approval()
    request.data["policy"] = {"decisions": ["approve", "decline"]}
    form = input_requests(stored(request), {}).requests["req_2"]["params"]["requestedSchema"]
    assert form["properties"]["decision"]["enum"] == ["approve", "decline"]
    assert "arguments" not in form["properties"]
    every = input_requests(stored(approval()), {}).requests["req_2"]["params"]["requestedSchema"]
    assert every["properties"]["decision"]["enum"] == ["approve", "edit", "decline"]

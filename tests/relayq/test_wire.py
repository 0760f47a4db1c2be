"""The wire shapes are a contract: camelCase JSON, fixed keys, lossless round trips."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from relayq import Answer, Request, RunResult, ToolResult, pending
from relayq.relay import (
    RelayCall,
    RelayResult,
    answer_declined,
    answer_output,
    relay_answer,
    relay_request,
)


def dump(model) -> dict:
    return json.loads(json.dumps(model.model_dump(mode="json", by_alias=True)))


def test_a_request_serialises_to_its_fixed_camel_case_shape():
    at = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)
    req = Request(
        id="req_1",
        kind="approval",
        prompt="ok?",
        url="https://x.example/r/1",
        data={"a": 1},
        expires_at=at,
    )

    assert dump(req) == {
        "id": "req_1",
        "kind": "approval",
        "prompt": "ok?",
        "url": "https://x.example/r/1",
        "data": {"a": 1},
        "expiresAt": "2026-12-01T09:30:00Z",
    }
    assert Request.model_validate(dump(req)) == req


def test_optional_request_and_answer_keys_are_absent_not_null():
    assert dump(Request(id="r", kind="k", prompt="p")) == {
        "id": "r",
        "kind": "k",
        "prompt": "p",
        "data": {},
    }
    assert dump(Answer(id="r")) == {"id": "r", "ok": True}
    assert dump(answer_declined("r", "no")) == {"id": "r", "ok": False, "reason": "no"}


def test_relay_requests_and_answers_use_the_calls_and_results_shapes():
    req = relay_request(
        [RelayCall(id="c1", name="lookup", input={"q": 1}, arguments='{"q":1}')], request_id="req_9"
    )
    assert dump(req)["data"] == {
        "calls": [{"id": "c1", "name": "lookup", "input": {"q": 1}, "arguments": '{"q":1}'}]
    }
    assert dump(relay_answer("req_9", [RelayResult(id="c1", output="x", is_error=True)])) == {
        "id": "req_9",
        "ok": True,
        "data": {"results": [{"id": "c1", "output": "x", "isError": True}]},
    }
    assert dump(answer_output("req_9", "y")) == {
        "id": "req_9",
        "ok": True,
        "data": {"output": "y", "isError": False},
    }


def test_snake_case_names_are_accepted_on_input_too():
    assert (
        Request.model_validate(
            {"id": "r", "kind": "k", "prompt": "p", "expires_at": None}
        ).expires_at
        is None
    )
    assert ToolResult.model_validate({"output": "o", "is_error": True}).is_error


def test_pending_stamps_an_id_and_an_expiry():
    before = datetime.now(UTC)
    req = pending("approval", "ok?", {"x": 1}, expires_in=timedelta(minutes=5))
    assert req.id.startswith("req_")
    assert req.expires_at is not None
    assert (
        before + timedelta(minutes=5) <= req.expires_at <= datetime.now(UTC) + timedelta(minutes=5)
    )


def test_a_run_result_round_trips_through_json():
    res = RunResult(
        status="pending",
        pending=Request(id="r", kind="k", prompt="p"),
        messages=[{"role": "user", "content": "hi"}],
    )
    assert RunResult.model_validate(dump(res)) == res


def test_malformed_wire_data_is_a_clear_validation_error():
    with pytest.raises(ValidationError, match="kind"):
        Request.model_validate({"id": "r", "prompt": "p"})

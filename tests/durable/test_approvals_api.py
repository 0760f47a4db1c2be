"""Approvals over HTTP: typed decisions, groups, quorum, the starter refused, the audit trail."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import ApiServer, Durable, Eventually, serve_api
from .test_api import open_request, settled_run

ANNA, BEN, CARA, SAM, VIC = "t0k-anna", "t0k-ben", "t0k-cara", "t0k-sam", "t0k-vic"
TOKENS = (
    f"anna:approver:{ANNA}:finance,ben:approver:{BEN}:finance|ops,"
    f"cara:approver:{CARA}:finance,sam:approver:{SAM}:support,vic:viewer:{VIC}"
)
STARTER = "t0k-starter"


@pytest.fixture(scope="module")
def api(durable: Durable) -> Iterator[ApiServer]:
    # anna may also start runs: the refunds she starts she may not approve
    yield from serve_api(durable, f"{TOKENS},anna:submitter:{STARTER}")


async def _halted_refund(api: ApiServer, prompt: str, eventually: Eventually) -> dict[str, Any]:
    async with api.http(STARTER) as http:
        res = await http.post("/api/runs", json={"agent": "refunds", "prompt": prompt})
    assert res.status_code == 201, res.text
    return await open_request(api, res.json()["id"], eventually, token=VIC)


async def _decide(api: ApiServer, token: str, request_id: str, **body: Any) -> Any:
    async with api.http(token) as http:
        return await http.post(f"/api/requests/{request_id}/decision", json=body)


async def test_two_of_finance_decide_a_refund_over_http_and_the_trail_records_them(
    api: ApiServer, durable: Durable, prompt: str, eventually: Eventually
):
    stored = await _halted_refund(api, prompt, eventually)
    rid, run_id = stored["request"]["id"], stored["runId"]
    assert stored["request"]["kind"] == "tool_approval"
    assert stored["request"]["data"]["arguments"] == {"order": "17", "amount": 500}

    # anna started the run (self-approval is forbidden); sam is not in finance
    refused_self = await _decide(api, ANNA, rid, decision="approve")
    refused_group = await _decide(api, SAM, rid, decision="approve")
    assert (refused_self.status_code, refused_group.status_code) == (403, 403)
    assert "may not decide" in refused_self.json()["detail"]
    # an edit that does not fit the tool's schema is 422; free text is 422
    too_much = await _decide(
        api, BEN, rid, decision="edit", arguments={"order": "17", "amount": 5000}
    )
    assert too_much.status_code == 422, too_much.text
    async with api.http(BEN) as http:
        free_text = await http.post(f"/api/requests/{rid}/answer", json={"output": "NO"})
    assert free_text.status_code == 422, free_text.text

    edited = await _decide(api, BEN, rid, decision="edit", arguments={"order": "17", "amount": 50})
    assert edited.status_code == 200, edited.text
    assert edited.json()["status"] == "open"
    again = await _decide(api, BEN, rid, decision="approve")
    assert again.status_code == 409, again.text
    approved = await _decide(api, CARA, rid, decision="approve")
    assert approved.status_code == 200, approved.text
    assert approved.json()["status"] == "answered"

    run = await settled_run(api, run_id, eventually, token=VIC)
    assert run["text"].endswith("refunded 50 on order 17")
    assert durable.count("tool", f"refund {run_id} 50") == 1

    async with api.http(VIC) as http:
        trail = (await http.get(f"/api/requests/{rid}/decisions")).json()
        audit = (await http.get("/api/audit", params={"actor": "ben", "outcome": "edited"})).json()
    assert [(d["actor"], d["outcome"], d["via"]) for d in trail] == [
        ("ben", "edited", "api"),
        ("cara", "approved", "api"),
    ]
    assert trail[0]["groups"] == ["finance", "ops"]
    assert trail[0]["diff"] == {"amount": [500, 50]}
    assert rid in [d["requestId"] for d in audit["items"]]


async def test_a_decline_needs_a_reason_and_the_body_is_checked(
    api: ApiServer, prompt: str, eventually: Eventually
):
    stored = await _halted_refund(api, prompt, eventually)
    rid = stored["request"]["id"]

    for body in (
        {"decision": "decline"},
        {"decision": "decline", "reason": "  "},
        {"decision": "approve", "reason": "why not"},
        {"decision": "edit"},
        {"decision": "maybe"},
    ):
        res = await _decide(api, BEN, rid, **body)
        assert res.status_code == 422, (body, res.text)

    declined = await _decide(api, BEN, rid, decision="decline", reason="already refunded")
    assert declined.status_code == 200, declined.text
    assert declined.json()["status"] == "answered"


async def test_the_audit_trail_pages_back_without_repeats(
    api: ApiServer, prompt: str, eventually: Eventually
):
    # Given two decisions of its own (the trail holds them whatever ran before)
    for n in range(2):
        stored = await _halted_refund(api, f"{prompt} {n}", eventually)
        declined = await _decide(api, BEN, stored["request"]["id"], decision="decline", reason="no")
        assert declined.status_code == 200, declined.text

    async with api.http(VIC) as http:
        first = (await http.get("/api/audit", params={"limit": 1})).json()
        assert len(first["items"]) == 1
        assert first["nextCursor"] is not None
        second = (
            await http.get("/api/audit", params={"limit": 1, "cursor": first["nextCursor"]})
        ).json()
        bad = await http.get("/api/audit", params={"cursor": "not-a-cursor"})
    assert second["items"][0]["id"] < first["items"][0]["id"]
    assert bad.status_code == 422


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"decision": "approve"}, id="approve"),
        pytest.param({"decision": "edit", "arguments": {"q": "x"}}, id="edit"),
        pytest.param({"decision": "decline", "reason": "no"}, id="decline"),
    ],
)
async def test_a_decision_on_a_relay_request_is_a_409_naming_its_answer_route_and_changes_nothing(
    api: ApiServer, prompt: str, eventually: Eventually, body: dict[str, Any]
):
    # Given a run waiting on a relay tool's call (no approval)
    async with api.http(STARTER) as http:
        res = await http.post("/api/runs", json={"agent": "lookup", "prompt": prompt})
    assert res.status_code == 201, res.text
    stored = await open_request(api, res.json()["id"], eventually, token=VIC)
    rid = stored["request"]["id"]
    assert stored["request"]["kind"] == "tool_call"

    # When an approver posts a decision on it
    refused = await _decide(api, BEN, rid, **body)

    # Then it is refused, naming the way to answer it, and nothing was kept
    assert refused.status_code == 409, refused.text
    assert refused.json()["detail"] == (
        f"request {rid} is a tool_call request, not an approval: it takes an answer, not a "
        f"decision: answer it with POST /api/requests/{rid}/answer"
    )
    async with api.http(VIC) as http:
        after = (await http.get(f"/api/requests/{rid}")).json()
        trail = (await http.get(f"/api/requests/{rid}/decisions")).json()
    assert (after["status"], after["revision"], trail) == ("open", stored["revision"], [])

    # ... and its answer route still takes the host's result, which the model gets
    async with api.http(BEN) as http:
        answered = await http.post(f"/api/requests/{rid}/answer", json={"output": "sunny"})
    assert answered.status_code == 200, answered.text
    run = await settled_run(api, stored["runId"], eventually, token=VIC)
    assert "sunny" in run["text"]

"""Approval policies and standing grants over HTTP, on real workers: every role, bad
bodies, and a grant that approves the next call and stops once revoked."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import ApiServer, Durable, Eventually, serve_api
from .test_api import log_in, open_request, settled_run

ANNA, LEE, SAM, VIC, ROOT, SUB = "t0k-anna", "t0k-lee", "t0k-sam", "t0k-vic", "t0k-root", "t0k-sub"
TOKENS = (
    f"anna:approver:{ANNA}:finance,lee:approver:{LEE}:finance,sam:approver:{SAM}:support,"
    f"vic:viewer:{VIC},root:admin:{ROOT},sub:submitter:{SUB}"
)


@pytest.fixture(scope="module")
def api(durable: Durable) -> Iterator[ApiServer]:
    yield from serve_api(durable, TOKENS)


def _order() -> str:
    return f"o-{uuid.uuid4().hex[:10]}"


async def _start(api: ApiServer, agent: str, order: str, amount: float) -> str:
    async with api.http(SUB) as http:
        prompt = json.dumps({"order": order, "amount": amount})
        res = await http.post("/api/runs", json={"agent": agent, "prompt": prompt})
    assert res.status_code == 201, res.text
    return str(res.json()["id"])


async def _post(api: ApiServer, token: str, path: str, body: dict[str, Any]) -> Any:
    async with api.http(token) as http:
        return await http.post(path, json=body)


async def _audit(api: ApiServer, **params: str) -> list[dict[str, Any]]:
    async with api.http(VIC) as http:
        res = await http.get("/api/audit", params={**params, "limit": 500})
    assert res.status_code == 200, res.text
    return list(res.json()["items"])


async def test_a_grant_made_with_an_approval_approves_the_same_call_until_revoked(
    api: ApiServer, durable: Durable, eventually: Eventually
):
    order = _order()
    first = await open_request(api, await _start(api, "desk", order, 40), eventually, token=VIC)
    rid = first["request"]["id"]
    grant = {"scope": "agent", "for": "8h", "max_uses": 5}

    made = await _post(
        api, ANNA, f"/api/requests/{rid}/decision", {"decision": "approve", "grant": grant}
    )
    assert made.status_code == 200, made.text

    async with api.http(VIC) as http:
        listed = (await http.get("/api/grants", params={"tool": "refund", "madeBy": "anna"})).json()
    [mine] = [g for g in listed["items"] if g["fromRequest"] == rid]
    assert (mine["scope"], mine["agent"], mine["maxUses"], mine["status"]) == (
        "agent",
        "desk",
        5,
        "active",
    )
    assert mine["match"] == {"arguments": {"order": order, "amount": 40}}

    # the same call again runs without a request, audited through the grant
    again = await _start(api, "desk", order, 40)
    run = await settled_run(api, again, eventually, token=VIC)
    assert run["text"] == f"refunded 40 on order {order}"
    [used] = [d for d in await _audit(api, through=f"grant:{mine['id']}") if d["runId"] == again]
    assert (used["outcome"], used["requestId"], used["actor"]) == (
        "approved",
        None,
        "relayq:policy",
    )
    # another amount is not the same call: a person is asked
    other = await _start(api, "desk", order, 41)
    assert (await open_request(api, other, eventually, token=VIC))["request"][
        "kind"
    ] == "tool_approval"

    # lee may not revoke anna's grant; anna may
    refused = await _post(api, LEE, f"/api/grants/{mine['id']}/revoke", {})
    assert refused.status_code == 403, refused.text
    revoked = await _post(api, ANNA, f"/api/grants/{mine['id']}/revoke", {})
    assert revoked.status_code == 200, revoked.text
    assert (revoked.json()["status"], revoked.json()["uses"]) == ("revoked", 1)
    after = await _start(api, "desk", order, 40)
    assert (await open_request(api, after, eventually, token=VIC))["request"]["id"]


async def test_who_may_make_a_grant(api: ApiServer, eventually: Eventually):
    order = _order()
    rid = (await open_request(api, await _start(api, "desk", order, 30), eventually, token=VIC))[
        "request"
    ]["id"]
    body = {"decision": "approve", "grant": {"scope": "run", "for": "1h"}}

    for token in (VIC, SUB, SAM):  # a viewer, a submitter, an approver of another group
        res = await _post(api, token, f"/api/requests/{rid}/decision", body)
        assert res.status_code == 403, (token, res.text)
    direct = {
        "tool": "refund",
        "agent": "desk",
        "scope": "agent",
        "for": "1h",
        "match": [f'order == "{order}"'],
    }
    for token in (ANNA, VIC, SUB):
        res = await _post(api, token, "/api/grants", direct)
        assert res.status_code == 403, (token, res.text)
    async with api.http(VIC) as http:
        assert all(g["fromRequest"] != rid for g in (await http.get("/api/grants")).json()["items"])

    made = await _post(api, ROOT, "/api/grants", {**direct, "reason": "month-end clean-up"})
    assert made.status_code == 201, made.text
    assert (made.json()["madeBy"], made.json()["makerGroups"]) == ("root", None)
    revoked = await _post(api, ROOT, f"/api/grants/{made.json()['id']}/revoke", {})
    assert revoked.status_code == 200, revoked.text


@pytest.mark.parametrize(
    "grant",
    [
        {"scope": "galaxy", "for": "1h"},
        {"scope": "run", "for": "forever"},
        {"scope": "run", "for": "1h", "max_uses": 0},
        {"scope": "run", "for": "1h", "match": ["amount is small"]},
        {"scope": "run", "for": "1h", "match": "anything"},
        {"scope": "run"},
        {"scope": "run", "for": "1h", "extra": 1},
    ],
)
async def test_a_bad_grant_is_a_422_and_decides_nothing(
    api: ApiServer, eventually: Eventually, grant: dict[str, Any]
):
    run_id = await _start(api, "desk", _order(), 20)
    rid = (await open_request(api, run_id, eventually, token=VIC))["request"]["id"]
    res = await _post(
        api, ANNA, f"/api/requests/{rid}/decision", {"decision": "approve", "grant": grant}
    )
    assert res.status_code == 422, res.text
    async with api.http(VIC) as http:
        still = (await http.get(f"/api/requests/{rid}")).json()
    assert still["status"] == "open"


async def test_a_grant_past_the_policy_or_with_a_decline_is_a_422(
    api: ApiServer, eventually: Eventually
):
    rid = (
        await open_request(api, await _start(api, "guarded", _order(), 100), eventually, token=VIC)
    )["request"]["id"]
    wide = await _post(
        api,
        ANNA,
        f"/api/requests/{rid}/decision",
        {"decision": "approve", "grant": {"scope": "all", "for": "1h"}},
    )
    assert wide.status_code == 422, wide.text
    assert "at most scope 'agent'" in wide.json()["detail"]
    declined = await _post(
        api,
        ANNA,
        f"/api/requests/{rid}/decision",
        {"decision": "decline", "reason": "no", "grant": {"scope": "run", "for": "1h"}},
    )
    assert declined.status_code == 422, declined.text


async def test_the_policy_spares_people_and_the_audit_says_so(
    api: ApiServer, durable: Durable, eventually: Eventually
):
    small, big, middling = _order(), _order(), _order()
    unasked = await _start(api, "guarded", small, 5)
    denied = await _start(api, "guarded", big, 950)
    asked = await _start(api, "guarded", middling, 100)

    assert (await settled_run(api, unasked, eventually, token=VIC))[
        "text"
    ] == f"refunded 5 on order {small}"
    refused = await settled_run(api, denied, eventually, token=VIC)
    assert refused["text"] == "refund was not called: its policy refuses it (amount > 900)"
    assert durable.count("tool", f"desk {denied} 950") == 0
    rid = (await open_request(api, asked, eventually, token=VIC))["request"]["id"]

    rows = {d["runId"]: d for d in await _audit(api, through="policy")}
    assert (rows[unasked]["outcome"], rows[denied]["outcome"]) == ("approved", "denied")
    assert asked not in rows

    # an edit that would carry the call past the deny rule is refused at the door
    past = await _post(
        api,
        ANNA,
        f"/api/requests/{rid}/decision",
        {"decision": "edit", "arguments": {"order": middling, "amount": 999}},
    )
    assert past.status_code == 422, past.text
    assert "refused by the tool's policy: amount > 900" in past.json()["detail"]
    # and changes nothing: the request is open, with no vote or decision on it
    async with api.http(VIC) as http:
        still = (await http.get(f"/api/requests/{rid}")).json()
        trail = (await http.get(f"/api/requests/{rid}/decisions")).json()
    assert (still["status"], still["revision"], trail) == ("open", 0, [])
    # an edit that breaks the schema is refused the same way
    unfit = await _post(
        api, ANNA, f"/api/requests/{rid}/decision",
        {"decision": "edit", "arguments": {"order": middling, "amount": "lots"}},
    )  # fmt: skip
    assert unfit.status_code == 422, unfit.text


async def test_the_inbox_grant_and_revoke_forms_go_through_the_same_rules(
    api: ApiServer, eventually: Eventually
):
    order = _order()
    rid = (await open_request(api, await _start(api, "desk", order, 25), eventually, token=VIC))[
        "request"
    ]["id"]
    form = {"scope": "agent", "for": "1h", "match": f'order == "{order}"'}

    for token in (VIC, SUB, SAM):  # may not decide it: nothing is granted
        async with api.http() as browser:
            csrf = await log_in(browser, token)
            res = await browser.post(f"/requests/{rid}/grant", data={**form, "csrf_token": csrf})
        assert res.status_code == 403, (token, res.status_code)
    async with api.http(VIC) as http:
        assert all(g["fromRequest"] != rid for g in (await http.get("/api/grants")).json()["items"])

    async with api.http() as browser:
        csrf = await log_in(browser, ANNA)
        made = await browser.post(f"/requests/{rid}/grant", data={**form, "csrf_token": csrf})
        assert made.status_code == 303, made.text
    async with api.http(VIC) as http:
        [grant] = [
            g for g in (await http.get("/api/grants")).json()["items"] if g["fromRequest"] == rid
        ]
    async with api.http() as browser:
        csrf = await log_in(browser, LEE)
        refused = await browser.post(f"/grants/{grant['id']}/revoke", data={"csrf_token": csrf})
        assert refused.status_code == 403
        assert "only its maker or an administrator" in refused.text
    async with api.http() as browser:
        csrf = await log_in(browser, ROOT)
        revoked = await browser.post(f"/grants/{grant['id']}/revoke", data={"csrf_token": csrf})
        assert revoked.status_code == 303


@pytest.mark.parametrize(
    "params",
    [{"status": "bogus"}, {"scope": "galaxy"}, {"cursor": "not-a-cursor"}, {"limit": 0}],
)
async def test_a_bad_grants_listing_is_a_422(api: ApiServer, params: dict[str, Any]):
    async with api.http(VIC) as http:
        res = await http.get("/api/grants", params=params)
    assert res.status_code == 422, res.text


@pytest.mark.parametrize(
    "body",
    [
        {"tool": "refund", "agent": "desk", "scope": "run", "for": "1h"},  # which run?
        {"tool": "refund", "scope": "agent", "for": "1h"},  # which agent?
        {"tool": "refund", "agent": "desk", "scope": "agent", "scopeId": "x", "for": "1h"},
        {"tool": "refund", "agent": "desk", "scope": "agent", "for": "1h", "match": ["a ~ 1"]},
        {"tool": "refund", "agent": "desk", "scope": "agent", "for": "1h", "match": {"x": 1}},
        {"tool": "refund", "agent": "desk", "scope": "agent", "for": 10**30},
        {"tool": "refund", "agent": "desk", "scope": "agent", "for": "1h", "maxUses": 10**12},
    ],
)
async def test_a_bad_administrator_grant_is_a_422_and_makes_nothing(
    api: ApiServer, body: dict[str, Any]
):
    mine: dict[str, str | int] = {
        "madeBy": "root",
        "limit": 500,
    }  # other modules' grants come and go meanwhile
    async with api.http(VIC) as http:
        before = (await http.get("/api/grants", params=mine)).json()["items"]
    res = await _post(api, ROOT, "/api/grants", body)
    assert res.status_code == 422, res.text
    async with api.http(VIC) as http:
        assert (await http.get("/api/grants", params=mine)).json()["items"] == before


async def test_another_grant_id_is_a_404_at_every_grant_route(api: ApiServer):
    async with api.http(VIC) as http:
        assert (await http.get("/api/grants/grt_nobody")).status_code == 404
    for token in (ANNA, ROOT):
        res = await _post(api, token, "/api/grants/grt_nobody/revoke", {})
        assert res.status_code == 404, res.text

"""Every door that answers or decides, for every role and every kind of request: one rule.

The rule (docs/http-api.md, "Who may answer what"): an approver answers and decides
everything; a submitter answers the relay calls and questions of the runs it started, and
never decides an approval or a budget; a viewer and a host (outside its leases) answer
nothing. Each cell seeds a fresh open request on a pending run started by sam, tries the
door as the role, and checks the request afterwards: changed where the rule allows,
untouched where it refuses. A door that skips the store's check fails its cells.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from mcp import MCPError
from sqlalchemy import delete, insert
from sqlmodel import col, func, select
from typer.testing import CliRunner

from api._auth import Tokens
from api.mcp.front import McpFront, mcp_app
from cli.main import app as cli_app
from store import Database, RequestRow, RunRow
from store.models import DecisionRow, utcnow
from tests.mcp_tasks_client import connected, update_task

from .conftest import (
    APPROVER,
    HOST,
    SQLITE_ONLY,
    SUBMITTER,
    TOKENS,
    VIEWER,
    ApiServer,
    Durable,
    serve_api,
    serve_in_thread,
)
from .test_api import log_in
from .test_cli import one_error_line

pytestmark = [pytest.mark.timeout(240), SQLITE_ONLY]

OTHER_SUBMITTER = "tok-sue-1"
MATRIX_TOKENS = f"{TOKENS},sue:submitter:{OTHER_SUBMITTER}"
PEOPLE = {
    "viewer": VIEWER,
    "approver": APPROVER,
    "submitter, its own run": SUBMITTER,
    "submitter, another's run": OTHER_SUBMITTER,
    "host": HOST,
}
KINDS = ("tool_call", "question", "tool_approval", "budget")

# The rule, written out here rather than read from relayq.authority: the test must not
# agree with the code by construction.
ALLOWED = {("approver", kind) for kind in KINDS} | {
    ("submitter, its own run", "tool_call"),
    ("submitter, its own run", "question"),
}

SCHEMA = {"type": "object", "properties": {"amount": {"type": "number"}}}


@dataclass
class Doors:
    api: ApiServer
    mcp_url: str
    db: Database


@pytest.fixture(scope="module")
def api(durable: Durable) -> Iterator[ApiServer]:
    yield from serve_api(durable, MATRIX_TOKENS)


@pytest.fixture(scope="module")
def doors(durable: Durable, api: ApiServer) -> Iterator[Doors]:
    front = McpFront(durable.settings, Tokens.parse(MATRIX_TOKENS), secret=b"s" * 32)
    db = durable.db()
    try:
        for served in serve_in_thread(mcp_app(front)):  # type: ignore[arg-type]
            yield Doors(api, f"{served.url}/mcp", db)
    finally:
        db.dispose()


def _data(kind: str) -> dict[str, Any]:
    if kind == "tool_call":
        return {"calls": [{"id": "c1", "name": "lookup", "input": {}, "arguments": "{}"}]}
    if kind in ("tool_approval", "budget"):
        return {"tool": "refund", "arguments": {"amount": 5}, "schema": SCHEMA}
    return {"asked": "which colour?"}


@asynccontextmanager
async def seeded(
    db: Database, kind: str, *, started_by: str = "sam", decisions: list[str] | None = None
) -> AsyncIterator[str]:
    """A fresh open request of `kind` on a pending run `started_by` started (an approval
    whose policy lets a person take only `decisions`, where given); removed after."""
    tag = uuid.uuid4().hex[:12]
    now = utcnow()
    run: dict[str, Any] = {
        "id": f"run_doors_{tag}", "agent": "doors", "conversation_id": f"conv_{tag}",
        "status": "pending", "started_by": started_by, "created_at": now, "updated_at": now,
    }  # fmt: skip
    data = _data(kind) | ({"policy": {"decisions": decisions}} if decisions else {})
    request: dict[str, Any] = {
        "id": f"req_doors_{tag}", "run_id": run["id"], "agent": "doors", "kind": kind,
        "prompt": f"a {kind} of the door matrix", "data": data, "calls": [],
        "status": "open", "created_at": now, "tool": "refund" if "_" in kind else None,
    }  # fmt: skip
    if kind == "tool_call":
        request["calls"] = _data(kind)["calls"]
    base = RequestRow(id="", run_id="", agent="", kind="", prompt="").model_dump()
    with db.write() as s:
        s.execute(insert(RunRow.__table__), [RunRow(**run).model_dump()])  # type: ignore[attr-defined]
        s.execute(insert(RequestRow.__table__), [base | request])  # type: ignore[attr-defined]
    try:
        yield request["id"]
    finally:
        with db.write() as s:
            s.execute(delete(DecisionRow).where(col(DecisionRow.request_id) == request["id"]))
            s.execute(delete(RequestRow).where(col(RequestRow.id) == request["id"]))


def state_of(db: Database, request_id: str) -> tuple[Any, ...]:
    with db.read() as s:
        row = s.get(RequestRow, request_id)
        assert row is not None
        decided = s.exec(
            select(func.count()).where(col(DecisionRow.request_id) == request_id)
        ).one()
        return row.status, row.revision, row.answer, decided


# Each door: (role's token, kind, request id) -> the HTTP status it answered, or "error"
# for an MCP error.
Door = Callable[[Doors, str, str, str], Awaitable[int | str]]


async def http_answer(d: Doors, token: str, kind: str, rid: str) -> int | str:
    bodies: dict[str, dict[str, Any]] = {
        "tool_call": {"output": "x"},
        "question": {"data": {"colour": "blue"}},
    }
    body = bodies.get(kind, {"data": {"decision": "approve"}})
    async with d.api.http(token) as http:
        return (await http.post(f"/api/requests/{rid}/answer", json=body)).status_code


async def http_decision(d: Doors, token: str, kind: str, rid: str) -> int | str:
    async with d.api.http(token) as http:
        res = await http.post(f"/api/requests/{rid}/decision", json={"decision": "approve"})
        return res.status_code


async def http_bulk(d: Doors, token: str, kind: str, rid: str) -> int | str:
    body = {"decision": "decline", "reason": "no", "requests": [{"id": rid}]}
    async with d.api.http(token) as http:
        return (await http.post("/api/requests/decisions", json=body)).status_code


def inbox_form(path: str, form: dict[str, str]) -> Door:
    async def door(d: Doors, token: str, kind: str, rid: str) -> int | str:
        async with d.api.http() as browser:
            csrf = await log_in(browser, token)
            res = await browser.post(
                path.format(rid=rid), data={**form, "rid": rid, "csrf_token": csrf}
            )
            return res.status_code

    return door


async def inbox_bulk(d: Doors, token: str, kind: str, rid: str) -> int | str:
    async with d.api.http() as browser:
        csrf = await log_in(browser, token)
        form = {"decision": "decline", "items": f"{rid}:0", "reason": "no", "csrf_token": csrf}
        return (await browser.post("/bulk", data=form)).status_code


async def mcp_update(d: Doors, token: str, kind: str, rid: str) -> int | str:
    response: dict[str, Any] = {
        "tool_call": {"c1": {"action": "accept", "content": {"output": "x"}}},
        "question": {rid: {"action": "accept", "content": {"answer": "blue"}}},
    }.get(kind, {rid: {"action": "accept", "content": {"decision": "approve"}}})
    run_id = rid.replace("req_", "run_")
    async with connected(d.mcp_url, token, tasks=True) as client:
        try:
            await update_task(client, run_id, response)
        except MCPError:
            return "error"
    return 200


DOORS: dict[str, Door] = {
    "POST /api/requests/{id}/answer": http_answer,
    "POST /api/requests/{id}/decision": http_decision,
    "POST /api/requests/decisions": http_bulk,
    "inbox approve": inbox_form("/requests/{rid}/approve", {"output": "x"}),
    "inbox decline": inbox_form("/requests/{rid}/decline", {"reason": "no"}),
    "inbox edit": inbox_form("/requests/{rid}/edit", {"arg:amount": "7"}),
    "inbox bulk": inbox_bulk,
    "MCP tasks/update": mcp_update,
}

# What a door takes at all, whoever comes: a decision fits approvals only, an edit too;
# a host opens neither the inbox nor MCP's tasks (it has no run of its own).
FITS = {
    "POST /api/requests/{id}/decision": {"tool_approval", "budget"},
    "inbox edit": {"tool_approval", "budget"},
}
# MCP reaches only the runs its caller started: anyone else is refused before any rule.
REACHES = {"MCP tasks/update": {"submitter, its own run"}}
# A refusal is a 403; a bulk decision's, past the door, a 409 naming each request and why.
REFUSED_WITH: dict[str, set[int | str]] = {
    "POST /api/requests/decisions": {403, 409},
    "inbox bulk": {403, 409},
    "MCP tasks/update": {"error"},
}
NOT_FOR = {"inbox approve": {"host"}, "inbox decline": {"host"}, "inbox edit": {"host"},
           "inbox bulk": {"host"}, "MCP tasks/update": {"host"}}  # fmt: skip


@pytest.mark.parametrize("door", list(DOORS))
async def test_every_door_lets_each_role_answer_just_what_the_rule_allows(doors: Doors, door: str):
    wrong: list[str] = []
    for person, token in PEOPLE.items():
        if person in NOT_FOR.get(door, ()):
            continue  # refused at the door, whatever the request: tests/durable/test_api.py
        for kind in KINDS:
            async with seeded(doors.db, kind) as rid:
                before = state_of(doors.db, rid)
                status = await DOORS[door](doors, token, kind, rid)
                after = state_of(doors.db, rid)
            allowed = (
                (person, kind) in ALLOWED
                and kind in FITS.get(door, set(KINDS))
                and person in REACHES.get(door, PEOPLE)
            )
            changed = after != before
            if allowed and (not changed or status not in (200, 303)):
                wrong.append(f"{person} x {kind}: refused ({status}), but the rule allows it")
            if not allowed and (changed or status in (200, 303)):
                wrong.append(f"{person} x {kind}: {status}, the request changed: {after}")
            refused_with = REFUSED_WITH.get(door, {403})
            if not allowed and kind in FITS.get(door, KINDS) and status not in refused_with:
                wrong.append(f"{person} x {kind}: refused with {status}, not {refused_with}")
    assert not wrong, f"{door}:\n" + "\n".join(wrong)


@pytest.mark.parametrize("method", ["tools/list", "tools/call", "tasks/get"])
async def test_a_token_whose_role_has_no_mcp_rights_gets_a_clean_403(
    doors: Doors, method: str, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.DEBUG)
    params = {"tools/list": {}, "tools/call": {"name": "run_lookup", "arguments": {"prompt": "p"}},
              "tasks/get": {"taskId": "run_x"}}[method]  # fmt: skip
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    headers = {"Authorization": f"Bearer {HOST}", "Accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient(trust_env=False) as http:
        reply = await http.post(doors.mcp_url, json=body, headers=headers)
    assert reply.status_code == 403, reply.text
    assert reply.json() == {"detail": "role 'host' may not use MCP: its door is /api/relay"}
    logged = "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
    assert "Traceback" not in logged
    assert not any(r.exc_info for r in caplog.records)


# -- what a person may decide: the policy's `decisions`, at every door ---------------------


async def _mcp_decides(d: Doors, rid: str, content: dict[str, Any]) -> int | str:
    async with connected(d.mcp_url, APPROVER, tasks=True) as client:
        try:
            await update_task(
                client, rid.replace("req_", "run_"), {rid: {"action": "accept", "content": content}}
            )
        except MCPError:
            return "error"
    return 200


def _api(path: str, body: dict[str, Any]) -> Door:
    async def door(d: Doors, token: str, kind: str, rid: str) -> int | str:
        async with d.api.http(token) as http:
            return (await http.post(path.format(rid=rid), json=body)).status_code

    return door


def _mcp(content: dict[str, Any]) -> Door:
    async def door(d: Doors, token: str, kind: str, rid: str) -> int | str:
        return await _mcp_decides(d, rid, content)

    return door


EDIT = {"decision": "edit", "arguments": {"amount": 7}}
DECLINE = {"decision": "decline", "reason": "no"}
ANSWER, DECIDE = "/api/requests/{rid}/answer", "/api/requests/{rid}/decision"
DECIDING: dict[str, tuple[str, Door]] = {
    "answer approve": ("approve", _api(ANSWER, {"data": {"decision": "approve"}})),
    "answer edit": ("edit", _api(ANSWER, {"data": EDIT})),
    "answer decline": ("decline", _api(ANSWER, {"ok": False, "reason": "no"})),
    "decision approve": ("approve", _api(DECIDE, {"decision": "approve"})),
    "decision edit": ("edit", _api(DECIDE, EDIT)),
    "decision decline": ("decline", _api(DECIDE, DECLINE)),
    "bulk decline": ("decline", http_bulk),
    "inbox approve": ("approve", inbox_form("/requests/{rid}/approve", {"output": "x"})),
    "inbox edit": ("edit", inbox_form("/requests/{rid}/edit", {"arg:amount": "7"})),
    "inbox decline": ("decline", inbox_form("/requests/{rid}/decline", {"reason": "no"})),
    "inbox bulk decline": ("decline", inbox_bulk),
    "MCP approve": ("approve", _mcp({"decision": "approve"})),
    "MCP edit": ("edit", _mcp({"decision": "edit", "arguments": '{"amount": 7}'})),
    "MCP decline": ("decline", _mcp({"decision": "decline", "reason": "no"})),
}  # fmt: skip
# Refused as a request that does not fit its answer (422); a bulk decision, past the door,
# as a 409 naming each request and why.
NOT_OFFERED: dict[str, set[int | str]] = {"bulk decline": {409}, "inbox bulk decline": {409}}


@pytest.mark.parametrize("door", list(DECIDING))
async def test_every_door_refuses_a_decision_the_tool_s_policy_does_not_offer(
    doors: Doors, door: str
):
    # Given an approval whose tool lets a person take every decision but this door's,
    # on a run the approver started (MCP reaches only its caller's runs)
    decision, call = DECIDING[door]
    others = [d for d in ("approve", "edit", "decline") if d != decision]
    async with seeded(doors.db, "tool_approval", started_by="alice", decisions=others) as rid:
        before = state_of(doors.db, rid)

        # When an approver takes it through the door
        status = await call(doors, APPROVER, "tool_approval", rid)

        # Then it is refused and the request is as it was
        after = state_of(doors.db, rid)
    assert status in NOT_OFFERED.get(door, {422, "error"}), status
    assert after == before


@pytest.mark.parametrize("door", ["decision approve", "decision edit", "decision decline"])
async def test_the_refusal_names_what_may_be_decided_and_what_is_offered_is_taken(
    doors: Doors, door: str
):
    decision, call = DECIDING[door]
    others = [d for d in ("approve", "edit", "decline") if d != decision]
    body = {"approve": {"decision": "approve"}, "edit": EDIT, "decline": DECLINE}[decision]
    async with (
        seeded(doors.db, "tool_approval", decisions=others) as rid,
        doors.api.http(APPROVER) as http,
    ):
        refused = await http.post(f"/api/requests/{rid}/decision", json=body)
    assert refused.status_code == 422
    assert f"may be decided by {', '.join(others)} only, not {decision}" in refused.text

    # ... and the same decision where the policy offers it is taken
    async with seeded(doors.db, "tool_approval", decisions=[decision]) as rid:
        before = state_of(doors.db, rid)
        assert await call(doors, APPROVER, "tool_approval", rid) == 200
        assert state_of(doors.db, rid) != before


async def test_the_inbox_shows_only_the_decisions_a_tool_offers(doors: Doors):
    async with (
        seeded(doors.db, "tool_approval", decisions=["approve", "decline"]) as rid,
        doors.api.http() as browser,
    ):
        await log_in(browser, APPROVER)
        page = (await browser.get(f"/requests/{rid}")).text
    assert f'action="/requests/{rid}/approve"' in page
    assert f'action="/requests/{rid}/decline"' in page
    assert f'action="/requests/{rid}/edit"' not in page


def test_the_cli_refuses_a_decision_the_tool_does_not_offer_in_one_line(
    doors: Doors, durable: Durable
):
    async def seed_and_try() -> tuple[str, Any, Any]:
        async with seeded(doors.db, "tool_approval", decisions=["approve", "decline"]) as rid:
            before = state_of(doors.db, rid)
            result = await asyncio.to_thread(
                CliRunner().invoke,
                cli_app,
                ["answer", rid, "--edit", "amount=7", "--as", "alice"],
                env={**durable.env, "COLUMNS": "250"},
            )
            return one_error_line(result), before, state_of(doors.db, rid)

    line, before, after = asyncio.run(seed_and_try())
    assert "may be decided by approve, decline only, not edit" in line
    assert after == before

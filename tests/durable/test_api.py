"""The HTTP API over real HTTP: a uvicorn server on a free port, real workers behind it."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.store.test_request_queries import listing_rows, seeded_requests

from .conftest import (
    APPROVER,
    OTHER_APPROVER,
    SUBMITTER,
    TOKEN_OF_ROLE,
    VIEWER,
    ApiServer,
    Durable,
    Eventually,
)


async def start_run(api: ApiServer, agent: str, prompt: str) -> str:
    async with api.http(SUBMITTER) as http:
        res = await http.post("/api/runs", json={"agent": agent, "prompt": prompt})
    assert res.status_code == 201, res.text
    run_id: str = res.json()["id"]
    return run_id


async def open_request(
    api: ApiServer, run_id: str, eventually: Eventually, token: str = VIEWER
) -> dict[str, Any]:
    """The open request the run waits on, once it waits."""
    async with api.http(token) as http:

        async def found() -> dict[str, Any] | None:
            res = await http.get("/api/requests", params={"run_id": run_id, "status": "open"})
            assert res.status_code == 200, res.text
            return next(iter(res.json()["items"]), None)

        stored: dict[str, Any] = await eventually(found, what=f"a request of {run_id}")
        return stored


async def settled_run(
    api: ApiServer, run_id: str, eventually: Eventually, status: str = "done", token: str = VIEWER
) -> dict[str, Any]:
    async with api.http(token) as http:

        async def ended() -> dict[str, Any] | None:
            run = (await http.get(f"/api/runs/{run_id}")).json()
            return run if run["status"] == status else None

        run: dict[str, Any] = await eventually(ended, what=f"run {run_id} to be {status}")
        return run


CSRF_FIELD = re.compile(r'name="csrf_token" value="([^"]+)"')


def csrf_of(html: str) -> str:
    """The CSRF token a page's forms carry."""
    found = CSRF_FIELD.search(html)
    assert found, "the page has a form with a CSRF token"
    return found.group(1)


async def log_in(http: httpx.AsyncClient, token: str) -> str:
    """Log `http` in to the inbox as a browser does; returns its pages' CSRF token."""
    form = await http.get("/")
    res = await http.post("/login", data={"token": token, "csrf_token": csrf_of(form.text)})
    assert res.status_code == 303, res.text
    inbox = await http.get("/")
    assert inbox.status_code == 200, inbox.text
    return csrf_of(inbox.text)


# The route table: (method, path, what the route needs, body). The inbox's routes
# (no /api) take the cookie and a CSRF token; the API's, a bearer token.
ROUTES: list[tuple[str, str, str, dict[str, Any] | None]] = [
    ("GET", "/api/runs", "read", None),
    ("GET", "/api/runs/run_x", "read", None),
    ("POST", "/api/runs", "submit", {"json": {"agent": "lookup", "prompt": "p"}}),
    ("POST", "/api/runs/run_x/cancel", "submit", None),
    ("GET", "/api/requests", "read", None),
    ("GET", "/api/requests/req_x", "read", None),
    ("POST", "/api/requests/req_x/answer", "answer", {"json": {"output": "x"}}),
    ("POST", "/api/requests/req_x/decision", "answer", {"json": {"decision": "approve"}}),
    (
        "POST",
        "/api/requests/decisions",
        "answer",
        {"json": {"decision": "approve", "requests": [{"id": "req_x"}]}},
    ),
    ("GET", "/api/requests/req_x/decisions", "read", None),
    ("GET", "/api/audit", "read", None),
    ("GET", "/api/batches", "read", None),
    ("GET", "/api/batches/batch_x", "read", None),
    ("GET", "/api/batches/batch_x/results", "read", None),
    (
        "POST",
        "/api/batches",
        "submit",
        {"json": {"agent": "lookup", "jobs": [{"id": "a", "prompt": "p"}]}},
    ),
    ("POST", "/api/batches/batch_x/cancel", "submit", None),
    ("GET", "/api/events", "read", None),
    ("GET", "/events", "read", None),
    ("POST", "/requests/req_x/approve", "answer", {"data": {"output": "x"}}),
    ("POST", "/requests/req_x/decline", "answer", {"data": {"reason": "x"}}),
    ("POST", "/requests/req_x/edit", "answer", {"data": {"arg:amount": "1"}}),
    ("POST", "/bulk/preview", "answer", {"data": {"action": "approve-selected", "ids": "req_x"}}),
    ("POST", "/bulk", "answer", {"data": {"decision": "approve", "items": "req_x:0"}}),
    ("POST", "/logout", "read", None),
    ("GET", "/api/grants", "read", None),
    ("GET", "/api/grants/grt_x", "read", None),
    (
        "POST",
        "/api/grants",
        "administer",
        {"json": {"tool": "refund", "agent": "desk", "scope": "agent", "for": "1h"}},
    ),
    ("POST", "/api/grants/grt_x/revoke", "answer", None),
    ("POST", "/requests/req_x/grant", "answer", {"data": {"scope": "run", "for": "1h"}}),
    ("POST", "/grants/grt_x/revoke", "answer", None),
    ("POST", "/api/relay/leases", "lease", {"json": {"tools": ["lookup"]}}),
    ("POST", f"/api/relay/leases/lease_{'0' * 32}/heartbeat", "lease", None),
    ("POST", f"/api/relay/leases/lease_{'0' * 32}/result", "lease", {"json": {"output": "x"}}),
    ("POST", f"/api/relay/leases/lease_{'0' * 32}/release", "lease", None),
]
ROLES_WITH = {
    "read": {"viewer", "approver", "submitter", "admin"},
    # a submitter answers its own runs' relay calls (the store's rule, whatever the
    # request: tests/durable/test_answer_doors.py)
    "answer": {"approver", "submitter", "admin"},
    "submit": {"submitter"},
    "lease": {"host"},
    "administer": {"admin"},
}
WRONG_ROLES = [
    pytest.param(method, path, role, body, id=f"{method} {path} as {role}")
    for method, path, need, body in ROUTES
    for role in sorted(set(TOKEN_OF_ROLE) - ROLES_WITH[need])
]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [pytest.param(m, p, b, id=f"{m} {p}") for m, p, _, b in ROUTES],
)
@pytest.mark.parametrize(
    "auth",
    [
        pytest.param({}, id="no token"),
        pytest.param({"headers": {"Authorization": "Bearer not-a-token"}}, id="unknown token"),
        pytest.param({"headers": {"Authorization": "Basic dXNlcjpwdw=="}}, id="not bearer"),
        pytest.param({"cookies": {"relayq_token": "not-a-token"}}, id="unknown cookie"),
    ],
)
async def test_every_route_refuses_a_caller_without_a_valid_token_with_401(
    api: ApiServer, method: str, path: str, body: dict[str, Any] | None, auth: dict[str, Any]
):
    async with httpx.AsyncClient(base_url=api.url, trust_env=False, **auth) as http:
        res = await http.request(method, path, **(body or {}))
    assert res.status_code == 401, res.text
    assert res.json()["detail"] == "a valid API token is required"
    assert "not-a-token" not in res.text


@pytest.mark.parametrize(("method", "path", "role", "body"), WRONG_ROLES)
async def test_every_route_refuses_a_token_of_the_wrong_role_with_403_and_changes_nothing(
    api: ApiServer, method: str, path: str, role: str, body: dict[str, Any] | None
):
    async with api.http(VIEWER) as viewer:
        before = (await viewer.get("/api/runs", params={"limit": 1000})).json()
    if path.startswith("/api/"):
        async with api.http(TOKEN_OF_ROLE[role]) as http:
            res = await http.request(method, path, **(body or {}))
    elif role not in ROLES_WITH["read"]:  # a token that may not read opens no inbox at all
        async with api.http() as browser:
            page = await browser.get("/")
            login = {"token": TOKEN_OF_ROLE[role], "csrf_token": csrf_of(page.text)}
            res = await browser.post("/login", data=login)
            assert "cannot open the inbox" in res.text
            assert (await browser.get("/")).status_code == 200, "still the login page"
            assert "relayq_token" not in browser.cookies
    else:  # the inbox: a logged-in browser posting its page's form, CSRF token and all
        async with api.http() as browser:
            csrf = await log_in(browser, TOKEN_OF_ROLE[role])
            form = {**(body or {}).get("data", {}), "csrf_token": csrf}
            res = await browser.request(method, path, data=form)
    assert res.status_code == 403, res.text
    if path.startswith("/api/") or role in ROLES_WITH["read"]:
        assert role in res.json()["detail"]
    async with api.http(VIEWER) as viewer:
        assert (await viewer.get("/api/runs", params={"limit": 1000})).json() == before


async def test_the_login_page_and_the_openapi_schema_need_no_token(api: ApiServer):
    async with api.http() as http:
        login = await http.get("/")
        schema = await http.get("/openapi.json")
        docs = await http.get("/docs")
    assert login.status_code == 200
    assert 'name="token"' in login.text
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    assert {"/api/runs", "/api/runs/{run_id}", "/api/runs/{run_id}/cancel"} <= set(paths)
    assert {"/api/requests", "/api/requests/{request_id}/answer", "/api/events"} <= set(paths)
    assert "HTTPBearer" in schema.json()["components"]["securitySchemes"]
    assert docs.status_code == 200


async def test_logging_in_sets_an_http_only_strict_cookie_and_an_unknown_token_is_refused(
    api: ApiServer,
):
    async with api.http() as http:
        form = csrf_of((await http.get("/")).text)
        refused = await http.post("/login", data={"token": "wrong-token-123", "csrf_token": form})
        assert refused.status_code == 401
        assert "wrong-token-123" not in refused.text
        assert "relayq_token=wrong" not in refused.headers.get("set-cookie", "")

        res = await http.post("/login", data={"token": APPROVER, "csrf_token": form})
        assert res.status_code == 303
        (cookie,) = [c.lower() for c in res.headers.get_list("set-cookie") if "relayq_token" in c]
        assert "httponly" in cookie
        assert "samesite=strict" in cookie

        inbox = await http.get("/")
        assert inbox.status_code == 200
        assert "alice (approver)" in inbox.text

    async with api.http() as http:
        http.cookies.set("relayq_token", "stale-token-456")
        stale = await http.get("/")
    assert stale.status_code == 401
    assert 'name="token"' in stale.text
    assert "stale-token-456" not in stale.text


async def test_the_inbox_forms_answer_without_javascript_and_refuse_a_second_answer(
    api: ApiServer, eventually: Eventually, prompt: str
):
    # Given a run halted on three relay calls, and an approver's browser session
    run_id = await start_run(api, "seed-three", prompt)
    request_id = (await open_request(api, run_id, eventually))["request"]["id"]
    async with api.http() as browser:
        csrf = await log_in(browser, APPROVER)
        assert f'data-request-id="{request_id}"' in (await browser.get("/")).text

        # When the approve form is posted with its default output
        res = await browser.post(f"/requests/{request_id}/approve", data={"csrf_token": csrf})
        assert res.status_code == 303
        assert res.headers["location"] == "/"

        # Then the page it leads to says so, once
        confirmed = await browser.get("/")
        assert f'<p class="flash" role="status">Approved {request_id}.</p>' in confirmed.text
        assert 'class="flash"' not in (await browser.get("/")).text

        # And every call gets it, and the run completes
        done = await settled_run(api, run_id, eventually)
        assert done["text"] == "approved,approved,approved"
        assert f'data-request-id="{request_id}"' not in (await browser.get("/")).text

        # And a second answer from a stale page is refused, on the page
        late = {"reason": "late", "csrf_token": csrf}
        again = await browser.post(f"/requests/{request_id}/decline", data=late)
        assert again.status_code == 409
        assert "already answered" in again.text
        assert 'class="flash"' not in again.text


async def test_an_approved_request_resumes_the_run_with_its_output_and_records_who_answered(
    api: ApiServer, eventually: Eventually, prompt: str
):
    # Given a run created over HTTP, halted on its relay call
    run_id = await start_run(api, "lookup", prompt)
    stored = await open_request(api, run_id, eventually)
    request_id = stored["request"]["id"]
    assert stored["agent"] == "lookup"
    assert [c["name"] for c in stored["request"]["data"]["calls"]] == ["lookup"]
    async with api.http(VIEWER) as viewer:
        pending = (await viewer.get(f"/api/runs/{run_id}")).json()
        assert pending["status"] == "pending"
        assert pending["pending"]["id"] == request_id
        listed = await viewer.get("/api/runs", params={"status": "pending", "agent": "lookup"})
        assert run_id in [r["id"] for r in listed.json()]
        # ... and an empty filter is no filter, as in every listing
        unfiltered = await viewer.get("/api/runs", params={"status": "", "agent": ""})
        assert unfiltered.status_code == 200, unfiltered.text
        assert run_id in [r["id"] for r in unfiltered.json()]

    # When an approver approves it with an output
    async with api.http(APPROVER) as approver:
        res = await approver.post(f"/api/requests/{request_id}/answer", json={"output": "found"})
    assert res.status_code == 200, res.text
    assert res.json()["status"] == "answered"

    # Then the run completes with that output in its transcript, and who answered is kept
    done = await settled_run(api, run_id, eventually)
    assert done["text"] == "found"
    assert [m["content"] for m in done["messages"] if m["role"] == "tool"] == ["found"]
    async with api.http(VIEWER) as viewer:
        after = (await viewer.get(f"/api/requests/{request_id}")).json()
    assert after["status"] == "answered"
    assert after["answeredBy"] == "alice"
    assert after["answeredAt"] is not None


async def test_a_declined_request_gives_the_run_an_error_result_with_the_reason(
    api: ApiServer, eventually: Eventually, prompt: str
):
    run_id = await start_run(api, "lookup", prompt)
    request_id = (await open_request(api, run_id, eventually))["request"]["id"]

    async with api.http(OTHER_APPROVER) as approver:
        body = {"ok": False, "reason": "not today"}
        res = await approver.post(f"/api/requests/{request_id}/answer", json=body)
    assert res.status_code == 200, res.text
    assert res.json()["answeredBy"] == "bob"

    done = await settled_run(api, run_id, eventually)
    assert done["text"] == "declined: not today"
    assert done["toolCalls"][0]["isError"] is True


async def test_partial_results_keep_the_request_open_until_the_rest_arrive(
    api: ApiServer, eventually: Eventually, prompt: str
):
    # Given a run halted on three relay calls
    run_id = await start_run(api, "seed-three", prompt)
    request_id = (await open_request(api, run_id, eventually))["request"]["id"]
    path = f"/api/requests/{request_id}/answer"

    async with api.http(APPROVER) as approver:
        # When one call is answered partially
        first = {"results": [{"id": "c2", "output": "B"}], "partial": True}
        res = await approver.post(path, json=first)
        assert res.status_code == 200, res.text
        assert res.json()["status"] == "open"
        assert (await approver.get(f"/api/runs/{run_id}")).json()["status"] == "pending"

        # Then that call cannot be answered again
        again = await approver.post(path, json={"results": [{"id": "c2", "output": "B2"}]})
        assert again.status_code == 409, again.text
        assert "already" in again.json()["detail"]

        # And the rest completes the request and the run
        rest = [{"id": "c1", "output": "A"}, {"id": "c3", "output": "C", "isError": False}]
        res = await approver.post(path, json={"results": rest})
        assert res.status_code == 200, res.text
        assert res.json()["status"] == "answered"

    done = await settled_run(api, run_id, eventually)
    assert done["text"] == "A,B,C"


async def test_a_second_answer_is_refused_with_409_and_changes_nothing(
    api: ApiServer, eventually: Eventually, prompt: str
):
    run_id = await start_run(api, "lookup", prompt)
    request_id = (await open_request(api, run_id, eventually))["request"]["id"]
    path = f"/api/requests/{request_id}/answer"
    async with api.http(APPROVER) as alice:
        assert (await alice.post(path, json={"output": "first"})).status_code == 200
    done = await settled_run(api, run_id, eventually)

    async with api.http(OTHER_APPROVER) as bob:
        for body in ({"output": "second"}, {"ok": False, "reason": "no"}):
            res = await bob.post(path, json=body)
            assert res.status_code == 409, res.text
            assert "already answered" in res.json()["detail"]
        stored = (await bob.get(f"/api/requests/{request_id}")).json()
        after = (await bob.get(f"/api/runs/{run_id}")).json()
    assert stored["answeredBy"] == "alice"
    assert stored["answer"]["data"]["output"] == "first"
    assert after == done


async def test_unknown_ids_are_404(api: ApiServer):
    async with api.http(VIEWER) as viewer, api.http(APPROVER) as approver:
        missing = [
            await viewer.get("/api/runs/run_nope"),
            await viewer.get("/api/requests/req_nope"),
            await approver.post("/api/requests/req_nope/answer", json={"output": "x"}),
        ]
    async with api.http(SUBMITTER) as submitter:
        missing.append(await submitter.post("/api/runs/run_nope/cancel"))
        missing.append(await submitter.post("/api/runs", json={"agent": "nope", "prompt": "p"}))
    for res in missing:
        assert res.status_code == 404, res.text
        assert "nope" in res.json()["detail"]


MALFORMED = [
    pytest.param({"ok": "maybe", "output": "x"}, id="ok not a bool"),
    pytest.param({}, id="nothing"),
    pytest.param({"output": "x", "data": {"output": "y"}}, id="two shapes"),
    pytest.param({"ok": False, "output": "x"}, id="decline with output"),
    pytest.param({"output": "x", "reason": "y"}, id="approve with reason"),
    pytest.param({"output": "x", "surprise": 1}, id="unknown field"),
    pytest.param({"results": [{"output": "x"}]}, id="result without id"),
    pytest.param({"results": [{"id": "c9", "output": "x"}]}, id="unknown call id"),
    pytest.param({"results": [{"id": "c1", "output": "x"}] * 2}, id="call id twice"),
    pytest.param({"output": "x"}, id="shorthand for three calls"),
    pytest.param("{not json", id="not json"),
]


async def test_malformed_answers_are_422_and_change_nothing(
    api: ApiServer, eventually: Eventually, prompt: str
):
    # Given a run halted on three relay calls
    run_id = await start_run(api, "seed-three", prompt)
    request_id = (await open_request(api, run_id, eventually))["request"]["id"]
    path = f"/api/requests/{request_id}/answer"

    async with api.http(APPROVER) as approver:
        # When each malformed answer is sent
        for param in MALFORMED:
            (body,) = param.values
            sent = (
                {"content": body, "headers": {"Content-Type": "application/json"}}
                if isinstance(body, str)
                else {"json": body}
            )
            res = await approver.post(path, **sent)
            # Then each is refused with a reason, and the request is untouched
            assert res.status_code == 422, (param.id, res.text)
            assert res.json()["detail"], param.id
        stored = (await approver.get(f"/api/requests/{request_id}")).json()
        run = (await approver.get(f"/api/runs/{run_id}")).json()
    assert stored["status"] == "open"
    assert stored["answer"] is None
    assert stored["answeredBy"] is None
    assert run["status"] == "pending"


async def test_malformed_or_unknown_runs_are_refused_and_none_is_created(api: ApiServer):
    async with api.http(SUBMITTER) as submitter:
        before = (await submitter.get("/api/runs", params={"limit": 1000})).json()
        for body in ({"agent": "lookup"}, {"agent": "", "prompt": "p"}, {"prompt": "p"}):
            res = await submitter.post("/api/runs", json=body)
            assert res.status_code == 422, res.text
        unknown = await submitter.post("/api/runs", json={"agent": "no-such", "prompt": "p"})
        assert unknown.status_code == 404
        assert "unknown agent 'no-such'" in unknown.json()["detail"]
        bad_filter = await submitter.get("/api/runs", params={"status": "sleeping"})
        assert bad_filter.status_code == 422
        assert (await submitter.get("/api/runs", params={"limit": 1000})).json() == before


async def test_a_run_naming_a_job_its_batch_already_ran_is_a_409_naming_it(
    api: ApiServer, prompt: str
):
    batch = f"batch-{uuid.uuid4().hex[:8]}"
    body = {"agent": "lookup", "prompt": prompt, "batchId": batch, "jobId": "job-7"}
    async with api.http(SUBMITTER) as submitter:
        first = await submitter.post("/api/runs", json=body)
        assert first.status_code == 201, first.text
        runs: dict[str, Any] = {"agent": "lookup", "limit": 1000}
        before = {r["id"] for r in (await submitter.get("/api/runs", params=runs)).json()}

        again = await submitter.post("/api/runs", json={**body, "prompt": f"{prompt} again"})

        assert again.status_code == 409, again.text
        assert again.json()["detail"] == (
            f"batch {batch!r} already has a run of job 'job-7'; nothing was started "
            "(a job runs once in its batch: give it another job id)"
        )
        after = {r["id"] for r in (await submitter.get("/api/runs", params=runs)).json()}
        assert after == before
        other = await submitter.post("/api/runs", json={**body, "jobId": "job-8"})
        assert other.status_code == 201, other.text


async def test_a_cancelled_run_cancels_its_request_and_takes_no_answer(
    api: ApiServer, eventually: Eventually, prompt: str
):
    run_id = await start_run(api, "lookup", prompt)
    request_id = (await open_request(api, run_id, eventually))["request"]["id"]
    async with api.http(SUBMITTER) as submitter:
        res = await submitter.post(f"/api/runs/{run_id}/cancel")
    assert res.status_code == 200, res.text
    assert res.json() == {"id": run_id, "status": "cancelled"}

    async with api.http(APPROVER) as approver:
        late = await approver.post(f"/api/requests/{request_id}/answer", json={"output": "x"})
        assert late.status_code == 409, late.text
        stored = (await approver.get(f"/api/requests/{request_id}")).json()
        listing = {"status": "cancelled", "run_id": run_id}
        cancelled = await approver.get("/api/requests", params=listing)
    assert stored["status"] == "cancelled"
    assert [r["request"]["id"] for r in cancelled.json()["items"]] == [request_id]
    assert (await settled_run(api, run_id, eventually, "cancelled"))["pending"] is None


# --- listing requests: filters, pages, totals ----------------------------------------


@dataclass
class Seeded:
    agent: str
    tag: str
    ids: list[str]

    def of(self, *numbers: int) -> list[str]:
        return [f"req_{self.tag}_{n:03d}" for n in numbers]


@pytest.fixture
def seeded(durable: Durable) -> Iterator[Seeded]:
    """65 requests of an agent of this test only (see `listing_rows`), removed after."""
    tag = uuid.uuid4().hex[:8]
    agent = f"listing-{tag}"
    db = durable.db()
    try:
        with seeded_requests(db, listing_rows(tag, agent)) as ids:
            yield Seeded(agent, tag, ids)
    finally:
        db.dispose()


async def test_the_request_listing_gives_a_page_an_honest_total_and_the_next_cursor(
    api: ApiServer, seeded: Seeded
):
    async with api.http(VIEWER) as viewer:
        # When the open requests are listed 25 at a time
        params: dict[str, Any] = {"agent": seeded.agent, "status": "open", "limit": 25}
        first = (await viewer.get("/api/requests", params=params)).json()

        # Then the page says how many match in all, oldest first, and how to go on
        assert set(first) == {"items", "total", "nextCursor"}
        assert first["total"] == 60
        assert [r["request"]["id"] for r in first["items"]] == seeded.of(*range(25))
        assert {"runId", "createdAt", "tool", "approvers"} <= set(first["items"][0])

        # And following the cursors shows each open request once, in order, then stops
        seen, page = [], first
        while True:
            seen += [r["request"]["id"] for r in page["items"]]
            if page["nextCursor"] is None:
                break
            res = await viewer.get("/api/requests", params={**params, "cursor": page["nextCursor"]})
            assert res.status_code == 200, res.text
            page = res.json()
            assert page["total"] == 60
    assert seen == seeded.of(*range(60))


LISTINGS = [
    pytest.param({"limit": 100}, [*range(60)], id="open ones by default, as the CLI and inbox"),
    pytest.param({"status": "all", "limit": 100}, [*range(65)], id="every status with all"),
    pytest.param({"status": "", "tool": "", "limit": 100}, [*range(60)], id="empty is no filter"),
    pytest.param({"status": "answered"}, [*range(60, 65)], id="status"),
    pytest.param(
        {"status": "answered,open", "limit": 100}, [*range(65)], id="statuses, comma-separated"
    ),
    pytest.param(
        {"status": ["answered", "open"], "limit": 100}, [*range(65)], id="statuses, repeated"
    ),
    pytest.param({"tool": "lookup", "status": "open"}, [*range(1, 60, 3)], id="tool"),
    pytest.param({"kind": "approval", "limit": 5}, [0, 4, 8, 12, 16], id="kind"),
    pytest.param({"group": "finance", "limit": 3}, [0, 5, 10], id="group"),
    pytest.param({"q": "100%"}, [7], id="search, percent taken literally"),
    pytest.param({"q": "RATE IS"}, [7, 8], id="search, any case"),
    pytest.param(
        {"created_after": "2025-03-01T09:00:58Z", "created_before": "2025-03-01T10:01:01+01:00"},
        [58, 59],
        id="a window of time, in any zone",
    ),
    pytest.param({"sort": "age", "order": "desc", "limit": 3}, [59, 58, 57], id="newest first"),
    pytest.param({"older_than": "1d", "limit": 100}, [*range(60)], id="older than, as the CLI"),
    pytest.param({"newer_than": "1d"}, [], id="newer than, as the CLI"),
    pytest.param(
        {"sort": "tool", "status": "open", "limit": 4}, [2, 5, 8, 11], id="by tool, none first"
    ),
]


@pytest.mark.parametrize(("params", "expected"), LISTINGS)
async def test_the_request_listing_filters_searches_and_sorts(
    api: ApiServer, seeded: Seeded, params: dict[str, Any], expected: list[int]
):
    async with api.http(VIEWER) as viewer:
        res = await viewer.get("/api/requests", params={"agent": seeded.agent, **params})
    assert res.status_code == 200, res.text
    assert [r["request"]["id"] for r in res.json()["items"]] == seeded.of(*expected)


async def test_the_request_listing_of_one_run_counts_only_that_run(api: ApiServer, seeded: Seeded):
    async with api.http(VIEWER) as viewer:
        page = (await viewer.get("/api/requests", params={"run_id": f"run_{seeded.tag}_2"})).json()
    assert (page["total"], page["nextCursor"]) == (10, None)
    assert [r["request"]["id"] for r in page["items"]] == seeded.of(*range(20, 30))


BAD_LISTINGS = [
    pytest.param({"cursor": "not-a-cursor"}, "bad cursor", id="a made-up cursor"),
    pytest.param({"status": "sleeping"}, "unknown status 'sleeping'", id="an unknown status"),
    pytest.param(
        {"created_before": "2025-03-01T09:00:00"}, "needs a time zone", id="a time without zone"
    ),
    pytest.param({"limit": 501}, "less than or equal to 500", id="a page too large"),
    pytest.param({"limit": 0}, "greater than or equal to 1", id="an empty page"),
    pytest.param({"sort": "size"}, "'age', 'agent' or 'tool'", id="an unknown sort"),
    pytest.param({"order": "up"}, "'asc' or 'desc'", id="an unknown order"),
    pytest.param({"search": "x"}, "unknown query parameter 'search'", id="a misspelt filter"),
    pytest.param({"older_than": "soon"}, "cannot read 'soon' as an age", id="an unread age"),
]


@pytest.mark.parametrize(("params", "says"), BAD_LISTINGS)
async def test_a_bad_listing_query_is_422_saying_what_is_wrong(
    api: ApiServer, params: dict[str, Any], says: str
):
    async with api.http(VIEWER) as viewer:
        res = await viewer.get("/api/requests", params=params)
    assert res.status_code == 422, res.text
    assert says in res.text


async def test_a_cursor_edited_or_of_another_sort_is_422(api: ApiServer, seeded: Seeded):
    async with api.http(VIEWER) as viewer:
        params: dict[str, Any] = {"agent": seeded.agent, "limit": 5}
        by_agent = (await viewer.get("/api/requests", params={**params, "sort": "agent"})).json()
        cursor = by_agent["nextCursor"]
        edited = cursor[:10] + ("A" if cursor[10] != "A" else "B") + cursor[11:]
        for bad in ({"cursor": cursor}, {"cursor": edited, "sort": "agent"}):
            res = await viewer.get("/api/requests", params={**params, **bad})
            assert res.status_code == 422, res.text
            assert res.json()["detail"].startswith("bad cursor: it was cut, edited")


async def next_event(lines: AsyncIterator[str], kind: str, **match: Any) -> dict[str, Any]:
    """The next server-sent event of `kind` whose data has the `match` items."""
    event, data = "message", ""
    async with asyncio.timeout(20):
        async for line in lines:
            if line.startswith("event:"):
                event = line.partition(":")[2].strip()
            elif line.startswith("data:"):
                data += line.partition(":")[2].strip()
            elif not line:
                if event == kind and data:
                    parsed: dict[str, Any] = json.loads(data)
                    if all(parsed.get(k) == v for k, v in match.items()):
                        return parsed
                event, data = "message", ""
    raise AssertionError(f"the stream ended before a {kind} event with {match}")


async def test_the_event_stream_tells_when_a_request_is_answered_and_ends_with_its_client(
    api: ApiServer, eventually: Eventually, prompt: str
):
    # Given a run waiting on a request, and a client following its events
    run_id = await start_run(api, "lookup", prompt)
    request_id = (await open_request(api, run_id, eventually))["request"]["id"]
    async with (
        api.http(VIEWER) as viewer,
        viewer.stream("GET", "/api/events", params={"run_id": run_id}) as stream,
    ):
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        lines = stream.aiter_lines()
        await next_event(lines, "ready")
        assert api.app.state.event_streams == 1

        # When the request is answered elsewhere
        async with api.http(APPROVER) as approver:
            path = f"/api/requests/{request_id}/answer"
            assert (await approver.post(path, json={"output": "seen"})).status_code == 200

        # Then the stream tells, and then tells the run is done
        answered = await next_event(lines, "request", id=request_id, status="answered")
        assert answered["answeredBy"] == "alice"
        assert answered["runId"] == run_id
        await next_event(lines, "run", id=run_id, status="done")

    # And once the client has gone, the server's stream ends too
    await eventually(lambda: api.app.state.event_streams == 0, what="the stream to end")

"""The HTTP API over real HTTP: a uvicorn server on a free port, real workers behind it."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from api._auth import Principal
from api._inbox import _item, templates
from api.app import create_app
from relayq import Request
from store import StoredRequest
from store.models import utcnow

from .conftest import Durable, Eventually

VIEWER, APPROVER, OTHER_APPROVER, SUBMITTER = (
    "tok-view-1",
    "tok-approve-1",
    "tok-bob-1",
    "tok-sub-1",
)
TOKENS = (
    f"vic:viewer:{VIEWER},alice:approver:{APPROVER},"
    f"bob:approver:{OTHER_APPROVER},sam:submitter:{SUBMITTER}"
)
TOKEN_OF_ROLE = {"viewer": VIEWER, "approver": APPROVER, "submitter": SUBMITTER}


@dataclass
class ApiServer:
    url: str
    app: FastAPI

    def http(self, token: str | None = None) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.AsyncClient(
            base_url=self.url,
            headers=headers,
            trust_env=False,
            timeout=httpx.Timeout(10, read=30),
        )


def serve_in_thread(app: FastAPI) -> Iterator[ApiServer]:
    """Run `app` under uvicorn on a free port in a thread; stop it after."""
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_level="warning", ws="none", lifespan="on"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="api-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the API server did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield ApiServer(url=f"http://127.0.0.1:{port}", app=app)
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        # An event stream left open would hold the server up: none may be.
        assert not thread.is_alive(), "the API server did not stop"


@pytest.fixture(scope="module")
def api(durable: Durable) -> Iterator[ApiServer]:
    yield from serve_in_thread(create_app(durable.settings, tokens=TOKENS))


async def start_run(api: ApiServer, agent: str, prompt: str) -> str:
    async with api.http(SUBMITTER) as http:
        res = await http.post("/api/runs", json={"agent": agent, "prompt": prompt})
    assert res.status_code == 201, res.text
    run_id: str = res.json()["id"]
    return run_id


async def open_request(api: ApiServer, run_id: str, eventually: Eventually) -> dict[str, Any]:
    """The open request the run waits on, once it waits."""
    async with api.http(VIEWER) as http:

        async def found() -> dict[str, Any] | None:
            res = await http.get("/api/requests", params={"run_id": run_id, "status": "open"})
            assert res.status_code == 200, res.text
            return next(iter(res.json()), None)

        stored: dict[str, Any] = await eventually(found, what=f"a request of {run_id}")
        return stored


async def settled_run(
    api: ApiServer, run_id: str, eventually: Eventually, status: str = "done"
) -> dict[str, Any]:
    async with api.http(VIEWER) as http:

        async def ended() -> dict[str, Any] | None:
            run = (await http.get(f"/api/runs/{run_id}")).json()
            return run if run["status"] == status else None

        run: dict[str, Any] = await eventually(ended, what=f"run {run_id} to be {status}")
        return run


# The route table: (method, path, what the route needs, body).
ROUTES: list[tuple[str, str, str, dict[str, Any] | None]] = [
    ("GET", "/api/runs", "read", None),
    ("GET", "/api/runs/run_x", "read", None),
    ("POST", "/api/runs", "submit", {"json": {"agent": "lookup", "prompt": "p"}}),
    ("POST", "/api/runs/run_x/cancel", "submit", None),
    ("GET", "/api/requests", "read", None),
    ("GET", "/api/requests/req_x", "read", None),
    ("POST", "/api/requests/req_x/answer", "answer", {"json": {"output": "x"}}),
    ("GET", "/api/events", "read", None),
    ("POST", "/requests/req_x/approve", "answer", {"data": {"output": "x"}}),
    ("POST", "/requests/req_x/decline", "answer", {"data": {"reason": "x"}}),
    ("POST", "/logout", "read", None),
]
ROLES_WITH = {
    "read": {"viewer", "approver", "submitter"},
    "answer": {"approver"},
    "submit": {"submitter"},
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
    async with api.http(TOKEN_OF_ROLE[role]) as http:
        res = await http.request(method, path, **(body or {}))
    assert res.status_code == 403, res.text
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
        refused = await http.post("/login", data={"token": "wrong-token-123"})
        assert refused.status_code == 401
        assert "wrong-token-123" not in refused.text
        assert "relayq_token=wrong" not in refused.headers.get("set-cookie", "")

        res = await http.post("/login", data={"token": APPROVER})
        assert res.status_code == 303
        cookie = res.headers["set-cookie"].lower()
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
        assert (await browser.post("/login", data={"token": APPROVER})).status_code == 303
        assert f'data-request-id="{request_id}"' in (await browser.get("/")).text

        # When the approve form is posted with its default output
        res = await browser.post(f"/requests/{request_id}/approve")
        assert res.status_code == 303
        assert res.headers["location"] == "/"

        # Then every call gets it, and the run completes
        done = await settled_run(api, run_id, eventually)
        assert done["text"] == "approved,approved,approved"
        assert f'data-request-id="{request_id}"' not in (await browser.get("/")).text

        # And a second answer from a stale page is refused, on the page
        again = await browser.post(f"/requests/{request_id}/decline", data={"reason": "late"})
        assert again.status_code == 409
        assert "already answered" in again.text


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
        cancelled = await approver.get("/api/requests", params={"status": "cancelled"})
    assert stored["status"] == "cancelled"
    assert request_id in [r["request"]["id"] for r in cancelled.json()]
    assert (await settled_run(api, run_id, eventually, "cancelled"))["pending"] is None


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


def test_the_inbox_escapes_what_agents_and_models_wrote():
    # Given a request whose every field carries markup
    evil = "<script>alert(1)</script>"
    stored = StoredRequest(
        request=Request(
            kind="tool_call",
            prompt=evil,
            data={"calls": [{"id": "c1", "name": evil, "input": {"q": evil}}]},
        ),
        run_id=evil,
        agent=evil,
        status="open",
        created_at=utcnow(),
    )

    # When the inbox renders it
    html = templates.get_template("inbox.html").render(
        who=Principal(name=evil, role="approver"),
        can_answer=True,
        requests=[_item(stored)],
        error=evil,
    )

    # Then no markup of theirs survives, and the arguments are shown as indented JSON
    assert "<script>alert" not in html
    assert html.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 5
    assert "{\n  &#34;q&#34;: &#34;&lt;script&gt;" in html

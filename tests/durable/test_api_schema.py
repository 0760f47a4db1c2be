"""The API against its own OpenAPI document, by schemathesis, over real HTTP.

Every operation, with generated parameters and bodies valid and not, and a valid
token of each role: no answer is a 500, and every answer (status, content type,
body) is one the document describes. Some generated ids are swapped for ids the
store holds (a run, its open request, a batch), so the routes past the lookups
are reached too, not only their 404s.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import Case
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from api._auth import ROLES, Permission
from api._relay import MAX_WAIT
from tests.waiting import until

from .conftest import TOKEN_OF_ROLE, ApiServer

pytestmark = pytest.mark.timeout(240)

EXAMPLES = 10
"""Cases per operation, each tried with each of the five roles on both stores: 10 with five
roles make about the calls 12 made with four, before the admin role came."""

CHECKS = [
    schemathesis.checks.not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@dataclass(frozen=True)
class Held:
    """Ids the store holds, for generated path parameters to hit now and then."""

    run_id: str
    request_id: str
    batch_id: str


@pytest.fixture(scope="module")
def held(api: ApiServer) -> Held:
    submit = {"Authorization": f"Bearer {TOKEN_OF_ROLE['submitter']}"}
    with httpx.Client(base_url=api.url, headers=submit, trust_env=False, timeout=10) as http:
        run = http.post("/api/runs", json={"agent": "approvals", "prompt": "deploy web"})
        assert run.status_code == 201, run.text
        run_id = run.json()["id"]
        batch = http.post(
            "/api/batches", json={"agent": "recall", "jobs": [{"id": "j1", "prompt": "hi"}]}
        )
        assert batch.status_code == 201, batch.text
        found = until(
            lambda: http.get("/api/requests", params={"run_id": run_id}).json()["items"],
            what=f"a request of run {run_id}",
        )
    return Held(run_id=run_id, request_id=found[0]["request"]["id"], batch_id=batch.json()["id"])


@pytest.fixture(scope="module")
def api_schema(api: ApiServer, held: Held) -> Any:
    loaded = schemathesis.openapi.from_url(f"{api.url}/openapi.json")
    real = {"run_id": held.run_id, "request_id": held.request_id, "batch_id": held.batch_id}

    @loaded.hook
    def map_path_parameters(context: Any, path_parameters: dict[str, Any] | None) -> Any:
        """Every other case names what the store holds, so the route gets past its lookup."""
        if not path_parameters or sum(map(len, map(str, path_parameters.values()))) % 2:
            return path_parameters
        return {name: real.get(name, value) for name, value in path_parameters.items()}

    # The event stream never ends by itself: its first event (`ready`) is read.
    loaded.config.max_stream_events = 1
    return loaded


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_every_answer_is_documented_and_none_is_a_500(case: Case) -> None:
    body = case.body if isinstance(case.body, dict) else {}
    wait = body.get("wait")
    if isinstance(wait, int | float) and 0 < wait <= MAX_WAIT:
        body["wait"] = 0.1  # a host's long poll: its length is not what is checked here
    for role in ROLES:  # each case with each role's token: 2xx, 403 and 404 all come up
        case.call_and_validate(
            headers={"Authorization": f"Bearer {TOKEN_OF_ROLE[role]}"},
            checks=CHECKS,
            timeout=30,
        )


@pytest.mark.parametrize("role", sorted(Permission.READ.value))
async def test_the_event_stream_opens_as_documented_for_each_role(
    api: ApiServer, held: Held, role: str
) -> None:
    async with api.http(TOKEN_OF_ROLE[role]) as http:
        for params in ({}, {"run_id": held.run_id}, {"run_id": "run_nobody"}):
            async with http.stream("GET", "/api/events", params=params) as res:
                assert res.status_code == 200
                assert res.headers["content-type"].startswith("text/event-stream")
                first = await anext(res.aiter_lines())
                assert first == "event: ready"
    async with httpx.AsyncClient(base_url=api.url, trust_env=False) as anonymous:
        assert (await anonymous.get("/api/events")).status_code == 401


@pytest.mark.parametrize(
    ("method", "path", "body", "names"),
    [
        ("GET", "/api/runs?agent=a%00b", None, "agent holds a NUL character"),
        ("GET", "/api/audit?actor=%00", None, "actor holds a NUL character"),
        ("GET", "/api/requests?q=x%00", None, "q holds a NUL character"),
        ("GET", "/api/requests/req_%00", None, "request_id holds a NUL character"),
        ("GET", "/?agent=%00", None, "agent holds a NUL character"),
        (
            "POST",
            "/api/requests/decisions",
            {"decision": "approve", "requests": [{"id": "req_\x00"}]},
            "holds a NUL character",
        ),
        (
            "POST",
            "/api/requests/decisions",
            {"decision": "approve", "requests": [{"id": "req_\udbeb"}]},
            "holds a lone surrogate",
        ),
    ],
)
def test_a_value_no_store_can_hold_is_a_422_naming_it_not_a_500(
    api: ApiServer, method: str, path: str, body: Any, names: str
) -> None:
    # (PostgreSQL's text refuses NUL: these were 500s there; the bodies' ids reach the store)
    token = {"Authorization": f"Bearer {TOKEN_OF_ROLE['approver']}"}
    sent = None if body is None else json.dumps(body)  # ASCII: a lone surrogate as \udbeb
    with httpx.Client(base_url=api.url, headers=token, trust_env=False, timeout=10) as http:
        res = http.request(method, path, content=sent, headers={"content-type": "application/json"})
    assert res.status_code == 422, res.text
    assert names in res.text

"""Standing grants from the command line, on real workers: `relayq answer --approve
--grant`, `relayq grants` (list, add, revoke), and what each refuses in one line."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from cli.main import app as cli_app

from .conftest import ApiServer, Durable, Eventually, serve_api
from .test_api import open_request, settled_run
from .test_cli import one_error_line

SUB, VIC = "t0k-sub", "t0k-vic"


@pytest.fixture(scope="module")
def api(durable: Durable) -> Iterator[ApiServer]:
    yield from serve_api(durable, f"sub:submitter:{SUB},vic:viewer:{VIC}")


async def _start(api: ApiServer, order: str, amount: float) -> str:
    async with api.http(SUB) as http:
        prompt = json.dumps({"order": order, "amount": amount})
        res = await http.post("/api/runs", json={"agent": "desk", "prompt": prompt})
    assert res.status_code == 201, res.text
    return str(res.json()["id"])


async def _cli(durable: Durable, *args: str) -> Any:
    return await asyncio.to_thread(
        CliRunner().invoke, cli_app, list(args), env={**durable.env, "COLUMNS": "250"}
    )


async def _status(api: ApiServer, rid: str) -> str:
    async with api.http(VIC) as http:
        return str((await http.get(f"/api/requests/{rid}")).json()["status"])


async def test_approve_with_a_grant_then_list_and_revoke_it(
    api: ApiServer, durable: Durable, eventually: Eventually
):
    order = f"o-{uuid.uuid4().hex[:10]}"
    rid = (await open_request(api, await _start(api, order, 70), eventually, token=VIC))["request"][
        "id"
    ]

    approved = await _cli(
        durable, "answer", rid, "--approve", "--as", "alice", "--group", "finance",
        "--grant", "agent", "--grant-for", "8h", "--grant-uses", "3",
        "--grant-match", f'order == "{order}"', "--grant-match", "amount <= 100",
    )  # fmt: skip
    assert approved.exit_code == 0, approved.output + approved.stderr
    assert approved.stdout.startswith("approved and granted grt_")

    listed = await _cli(durable, "grants", "--made-by", "alice", "--json")
    assert listed.exit_code == 0, listed.stderr
    [grant] = [g for g in json.loads(listed.stdout)["items"] if g["fromRequest"] == rid]
    assert grant["match"] == {"where": [f'order == "{order}"', "amount <= 100"]}
    assert (grant["maxUses"], grant["status"]) == (3, "active")

    cheaper = await _start(api, order, 60)  # within the constraints: nobody is asked
    assert (await settled_run(api, cheaper, eventually, token=VIC))[
        "text"
    ] == f"refunded 60 on order {order}"
    table = await _cli(durable, "grants", "--tool", "refund", "--status", "active")
    assert grant["id"] in table.stdout
    assert "1/3" in table.stdout

    revoked = await _cli(durable, "grants", "revoke", grant["id"])
    assert revoked.exit_code == 0, revoked.stderr
    assert f"revoked {grant['id']} (used 1 times)" in revoked.stdout
    again = await _start(api, order, 60)
    assert (await open_request(api, again, eventually, token=VIC))["request"][
        "kind"
    ] == "tool_approval"


async def test_an_administrator_grant_from_the_cli(
    api: ApiServer, durable: Durable, eventually: Eventually
):
    order = f"o-{uuid.uuid4().hex[:10]}"
    made = await _cli(
        durable, "grants", "add", "refund", "--agent", "desk", "--scope", "agent", "--for", "1h",
        "--match", f'order == "{order}"', "--reason", "a known customer",
    )  # fmt: skip
    assert made.exit_code == 0, made.stderr
    assert made.stdout.startswith("granted grt_")
    run_id = await _start(api, order, 900)
    assert (await settled_run(api, run_id, eventually, token=VIC))[
        "text"
    ] == f"refunded 900 on order {order}"
    grant_id = made.stdout.split()[1].rstrip(":")
    assert (await _cli(durable, "grants", "revoke", grant_id)).exit_code == 0


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--approve", "--grant", "galaxy", "--grant-for", "1h"], "one of run, conversation"),
        (["--approve", "--grant", "run"], "takes --grant-for"),
        (["--approve", "--grant-uses", "2"], "go with --grant SCOPE"),
        (["--approve", "--grant", "run", "--grant-for", "ever"], "a grant lasts"),
        (
            ["--approve", "--grant", "run", "--grant-for", "1h", "--grant-match", "x ~ 1"],
            "not a constraint",
        ),
        (
            ["--decline", "no", "--grant", "run", "--grant-for", "1h"],
            "goes with --approve or --edit",
        ),
    ],
)
async def test_a_bad_grant_on_the_command_line_is_one_line_and_changes_nothing(
    api: ApiServer, durable: Durable, eventually: Eventually, args: list[str], says: str
):
    run_id = await _start(api, f"o-{uuid.uuid4().hex[:10]}", 10)
    rid = (await open_request(api, run_id, eventually, token=VIC))["request"]["id"]
    result = await _cli(durable, "answer", rid, *args, "--as", "alice", "--group", "finance")
    assert says in one_error_line(result)
    assert await _status(api, rid) == "open"

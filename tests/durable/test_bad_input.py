"""Bad input never fails a run, and nothing private reaches a log.

On real workers, SQLite and PostgreSQL alike: an answer or a prompt the store
could not keep (a NUL character, a lone surrogate, too large) is refused where
it comes in, by the Python client, the HTTP API and the CLI, and changes
nothing; a provider's error and a database's error are stored and logged
without the request, the SQL or a key; the API's access log holds no token.
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner, Result

from api.app import create_app
from cli.main import app as cli_app
from relayq import ResumeError, RunResult
from relayq.limits import (
    DEFAULT_MAX_ANSWER_BYTES,
    AnswerTooLarge,
    UnstorableAnswer,
    UnstorableInput,
)
from relayq.relay import RelayResult, answer_declined, answer_output, relay_answer
from tasks import DurableClient
from tests.durable.bad_input_agents import SYSTEM_PROMPT
from tests.ports import free_port
from tests.processes import stop_group
from tests.provider_server import API_KEY, ProviderServer, Reply

from .conftest import (
    ApiServer,
    Durable,
    SpareWorkers,
    serve_api,
    start_api_process,
    unique_name,
)
from .test_cli import (
    halt_on_lookup,
    module_began,  # noqa: F401  (autouse: its snapshots see its own runs)
    one_error_line,
    store_snapshot,
    stored_request,
)

ONE_LANE = True  # tests/conftest.py: its worker and provider, once per database

VIEWER, APPROVER, SUBMITTER = "tok-bad-view-1", "tok-bad-approve-1", "tok-bad-sub-1"
TOKENS = f"vic:viewer:{VIEWER},alice:approver:{APPROVER},sam:submitter:{SUBMITTER}"
TWO_MIB = 2 * DEFAULT_MAX_ANSWER_BYTES


@pytest.fixture(scope="module")
def api(durable: Durable) -> Iterator[ApiServer]:
    yield from serve_api(durable, TOKENS)


@pytest.fixture
def cli(durable: Durable) -> Callable[..., Result]:
    runner = CliRunner()
    env = {**durable.env, "COLUMNS": "250"}

    def invoke(*args: str) -> Result:
        return runner.invoke(cli_app, list(args), env=env, catch_exceptions=False)

    return invoke


async def halted(client: DurableClient, prompt: str) -> tuple[str, str]:
    """A run of `lookup` waiting on its relay call: (run id, request id)."""
    res = await client.run("lookup", prompt, timeout=30)
    assert res.status == "pending", res.error
    assert res.pending is not None
    assert res.run_id is not None
    return res.run_id, res.pending.id


def run_ids(durable: Durable) -> set[str]:
    """Every run the module stored: a refused prompt adds none."""
    return {run_id for run_id, _, _ in store_snapshot(durable)[0]}


async def unchanged(client: DurableClient, run_id: str, request_id: str) -> None:
    """The run still waits on its request, which holds no answer."""
    [stored] = await client.requests(None, run_id=run_id)
    assert (stored.status, stored.answer, stored.answered_by) == ("open", None, None)
    assert (await client.result(run_id)).status == "pending"


async def finishes_with(client: DurableClient, request_id: str, run_id: str, text: str) -> None:
    await client.submit_answer(answer_output(request_id, text))
    res: RunResult = await client.result(run_id, wait=True, timeout=30)
    assert (res.status, res.text) == ("done", text), res.error


# -- rule 1: what the store cannot keep is refused before it is accepted ----------------------

UNSTORABLE: dict[str, Callable[[str], Any]] = {
    "NUL in the output": lambda rid: answer_output(rid, "found\x00it"),
    "NUL in the reason": lambda rid: answer_declined(rid, "no\x00"),
    "NUL in a result": lambda rid: relay_answer(rid, [RelayResult(id="c1", output="\x00")]),
    "NUL in a data key": lambda rid: {"id": rid, "data": {"output": "x", "k\x00": 1}},
    "a lone surrogate": lambda rid: answer_output(rid, "caf\udce9"),
}


@pytest.mark.parametrize("unstorable", UNSTORABLE.values(), ids=UNSTORABLE.keys())
async def test_an_answer_the_store_cannot_keep_is_refused_and_the_run_waits_for_a_good_one(
    client: DurableClient, prompt: str, unstorable: Callable[[str], Any]
):
    # Given a run halted on its relay call
    run_id, request_id = await halted(client, prompt)

    # When an answer holding what the store cannot keep is submitted
    with pytest.raises(UnstorableAnswer) as refused:
        await client.submit_answer(unstorable(request_id))

    # Then it is refused as a ResumeError, nothing changed, and a good answer finishes the run
    assert isinstance(refused.value, ResumeError)
    await unchanged(client, run_id, request_id)
    await finishes_with(client, request_id, run_id, "found")


async def test_a_prompt_the_store_cannot_keep_starts_no_run(
    durable: Durable, client: DurableClient, prompt: str
):
    before = run_ids(durable)

    with pytest.raises(UnstorableInput, match="prompt refused: it holds a NUL"):
        await client.start("lookup", f"{prompt}\x00")
    with pytest.raises(UnstorableInput, match=r"prompts\[1\] refused: it holds a lone surrogate"):
        await client.start_many("lookup", [prompt, f"{prompt}\udcff"])

    assert run_ids(durable) == before


# -- rule 2: a size limit, refused clearly and cheaply ---------------------------------------


async def test_an_answer_over_the_limit_given_through_the_python_client_is_refused(
    client: DurableClient, prompt: str
):
    run_id, request_id = await halted(client, prompt)

    with pytest.raises(AnswerTooLarge, match="RELAYQ_MAX_ANSWER_BYTES") as refused:
        await client.submit_answer(answer_output(request_id, "x" * TWO_MIB))

    assert refused.value.limit == DEFAULT_MAX_ANSWER_BYTES
    await unchanged(client, run_id, request_id)
    await finishes_with(client, request_id, run_id, "found")


def _post_headers_only(url: str, path: str, length: int, token: str) -> bytes:
    """Send a request's head announcing `length` bytes of body, send none, read the reply."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n".encode()
        )
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
        return reply


async def test_the_api_refuses_a_10_mb_answer_with_413_before_reading_it(
    api: ApiServer, client: DurableClient, prompt: str
):
    # Given a run waiting on its request
    run_id, request_id = await halted(client, prompt)

    # When a client announces a 10 MB answer (and sends none of it yet, as one sending
    # `Expect: 100-continue` would wait)
    reply = _post_headers_only(
        api.url, f"/api/requests/{request_id}/answer", 10 * 1024 * 1024, APPROVER
    )

    # Then the API answers 413 at once, having read nothing of the body, and nothing changed
    assert reply.startswith(b"HTTP/1.1 413 "), reply[:200]
    assert b"RELAYQ_MAX_ANSWER_BYTES" in reply
    await unchanged(client, run_id, request_id)


async def test_a_body_without_a_length_is_read_no_further_than_the_limit(durable: Durable):
    # The real app, driven as uvicorn drives it, counting the chunks it pulls.
    app = create_app(durable.settings, tokens=TOKENS)
    chunk = b"x" * 65536
    pulled = 0
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        pulled += 1
        return {"type": "http.request", "body": chunk, "more_body": pulled < 1600}  # 100 MB

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    headers = {
        "authorization": f"Bearer {APPROVER}",
        "content-type": "application/json",
        "transfer-encoding": "chunked",
    }
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/api/requests/req_x/answer",
        "raw_path": b"/api/requests/req_x/answer",
        "query_string": b"",
        "root_path": "",
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
    }
    await app(scope, receive, send)

    assert sent[0]["status"] == 413
    limit = 3 * durable.settings.max_answer_bytes + 64 * 1024
    assert pulled * len(chunk) <= limit + len(chunk), f"read {pulled} chunks of 64 KiB"


async def test_the_api_refuses_unstorable_answers_with_422_and_oversize_ones_with_413(
    api: ApiServer, client: DurableClient, prompt: str
):
    run_id, request_id = await halted(client, prompt)
    path = f"/api/requests/{request_id}/answer"
    raw = {  # JSON text, as a client sends it
        "NUL": '{"output": "found\\u0000"}',
        "lone surrogate": '{"output": "caf\\udce9"}',
        "NaN": '{"data": {"output": "x", "score": NaN}}',
        "NUL in a reason": '{"ok": false, "reason": "no\\u0000"}',
    }
    async with api.http(APPROVER) as approver:
        for name, body in raw.items():
            res = await approver.post(
                path, content=body, headers={"Content-Type": "application/json"}
            )
            assert res.status_code == 422, (name, res.text)
            assert "refused" in res.json()["detail"], name
        # A body that does not validate is a 422 too, even quoting what no response can carry
        lax = '{"ok": "yes", "output": "caf\\udce9", "extra": NaN}'
        res = await approver.post(path, content=lax, headers={"Content-Type": "application/json"})
        assert res.status_code == 422, res.text
        assert {e["loc"][-1] for e in res.json()["detail"]} == {"ok", "extra"}
        # Over the limit, though small enough for the API to read: the store says 413
        big = await approver.post(path, json={"output": "x" * TWO_MIB})
        assert big.status_code == 413, big.text
        assert "RELAYQ_MAX_ANSWER_BYTES" in big.json()["detail"]
        await unchanged(client, run_id, request_id)
        good = await approver.post(path, json={"output": "found"})
        assert good.status_code == 200, good.text


async def test_the_api_refuses_prompts_the_store_cannot_keep(
    api: ApiServer, durable: Durable, prompt: str
):
    before = run_ids(durable)
    async with api.http(SUBMITTER) as submitter:
        nul = await submitter.post(
            "/api/runs",
            content=json.dumps({"agent": "lookup", "prompt": f"{prompt}\x00"}),
            headers={"Content-Type": "application/json"},
        )
        big = await submitter.post("/api/runs", json={"agent": "lookup", "prompt": "x" * TWO_MIB})
    assert nul.status_code == 422, nul.text
    assert "NUL" in nul.json()["detail"]
    assert big.status_code == 413, big.text
    assert run_ids(durable) == before


def test_the_cli_refuses_what_the_store_cannot_keep_in_one_line(
    cli: Callable[..., Result], durable: Durable, prompt: str, tmp_path: Path
):
    # Invalid UTF-8 in an argument reaches Python as a lone surrogate
    before = run_ids(durable)
    assert "lone surrogate" in one_error_line(cli("run", "lookup", f"{prompt}\udcff"))
    jobs = tmp_path / unique_name("jobs.jsonl")
    jobs.write_text(
        json.dumps({"id": 1, "prompt": prompt}) + "\n" + '{"id": 2, "prompt": "\\u0000"}\n'
    )
    assert "holds a NUL" in one_error_line(
        cli("batch", "lookup", str(jobs), "-o", str(tmp_path / "o"))
    )
    assert not (tmp_path / "o.runs").exists()
    assert run_ids(durable) == before

    _, request_id = halt_on_lookup(cli, prompt)
    assert "lone surrogate" in one_error_line(cli("answer", request_id, "--output", "x\udcff"))
    lax = tmp_path / "results.json"
    lax.write_text(json.dumps([{"id": "c1", "output": "x", "isError": "yes"}]))
    assert "isError must be true or false" in one_error_line(
        cli("answer", request_id, "--results", str(lax))
    )
    stored = stored_request(durable, request_id)
    assert (stored.status, stored.answer, stored.answered_by) == ("open", None, None)


# -- rule 3: one strict parser --------------------------------------------------------------


async def test_ok_yes_is_refused_by_the_python_client_and_by_the_api_alike(
    api: ApiServer, client: DurableClient, prompt: str
):
    run_id, request_id = await halted(client, prompt)
    lax = [
        ({"id": request_id, "ok": "yes", "data": {"output": "x"}}, {"ok": "yes", "output": "x"}),
        (
            {"id": request_id, "data": {"results": [{"id": "c1", "output": "x", "isError": "no"}]}},
            {"results": [{"id": "c1", "output": "x", "isError": "no"}]},
        ),
    ]
    async with api.http(APPROVER) as approver:
        for wire, body in lax:
            with pytest.raises(ResumeError, match="malformed answer"):
                await client.submit_answer(wire)
            res = await approver.post(f"/api/requests/{request_id}/answer", json=body)
            assert res.status_code == 422, res.text
    await unchanged(client, run_id, request_id)


# -- rule 4: errors stored and logged without the request, SQL or keys -----------------------

PROMPT_SECRET = "my diary: today I met Carol by the river, card 4242-4242-4242-4242"
SECRETS = ("4471-ALPHA", "vault code", "Carol", "4242-4242", API_KEY, "sk-live-9f8e7d6c5b4a3928")


def echo_error(dialect: str, body: dict[str, Any]) -> Reply:
    """A 400 quoting the whole request and a couple of keys, as some gateways send."""
    message = f"Invalid body (key sk-live-9f8e7d6c5b4a3928, {API_KEY}): {json.dumps(body)}"
    return Reply(
        {"error": {"type": "invalid_request_error", "message": message, "param": body}}, 400
    )


@pytest.fixture(scope="module")
def echoing() -> Iterator[ProviderServer]:
    with ProviderServer(echo_error) as server:
        yield server


@pytest.fixture(scope="module")
def bad_input_worker(durable: Durable, echoing: ProviderServer) -> Iterator[Durable]:
    spares = SpareWorkers(durable)
    try:
        yield spares.start(
            RELAYQ_AGENTS="tests.durable.agents,tests.durable.bad_input_agents",
            RELAYQ_TEST_PROVIDER_URL=echoing.openai_url,
            RELAYQ_TEST_PROVIDER_KEY=API_KEY,
            NO_PROXY="127.0.0.1,localhost",
            no_proxy="127.0.0.1,localhost",
        )
    finally:
        for worker in spares.started:
            worker.stop()


def leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


async def test_a_provider_error_echoing_the_request_is_stored_and_logged_without_it(
    bad_input_worker: Durable, echoing: ProviderServer
):
    # Given an agent on a provider whose 400 quotes the request
    async with DurableClient(settings=bad_input_worker.settings) as client:
        # When a run calls it
        run_id = await client.start("echoing-provider", PROMPT_SECRET)
        res = await client.result(run_id, wait=True, timeout=30)

    # Then the run failed with the status, type and message, and nothing of the request
    assert res.status == "failed"
    assert res.error is not None
    assert "answered 400 (invalid_request_error): Invalid body (key [redacted]" in res.error
    sent = json.dumps(echoing.seen[-1].body)
    assert SYSTEM_PROMPT in sent
    assert PROMPT_SECRET in sent
    assert leaks(res.error) == [], res.error
    log = bad_input_worker.worker.logfile.read_text(errors="replace")
    assert run_id in log
    assert leaks(log) == []


async def test_a_model_text_holding_a_nul_finishes_the_run_on_either_database(
    bad_input_worker: Durable,
):
    # Given an agent whose final text holds a NUL (PostgreSQL's text columns refuse it)
    async with DurableClient(settings=bad_input_worker.settings) as client:
        run_id = await client.start("nul-text", PROMPT_SECRET)
        res = await client.result(run_id, wait=True, timeout=30)

    # Then the run is done, the NUL kept as U+FFFD in its text, nothing logged of it
    assert (res.status, res.error) == ("done", None)
    assert res.text == f"done\ufffd {PROMPT_SECRET}"
    log = bad_input_worker.worker.logfile.read_text(errors="replace")
    assert "[SQL:" not in log
    assert leaks(log) == []


# -- rule 5: no token in the access log -------------------------------------------------------


@pytest.fixture
def api_process(durable: Durable, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """`relayq api` as a real process, its output (uvicorn's logs) in a file."""
    port = free_port()
    log = tmp_path / "api.log"
    proc = start_api_process({**durable.env, "RELAYQ_API_TOKENS": TOKENS}, port, log)
    try:
        yield f"http://127.0.0.1:{port}", log
    finally:
        stop_group(proc)


def test_the_access_log_holds_no_token_even_one_given_in_the_url(
    api_process: tuple[str, Path],
):
    url, log = api_process
    secret = f"tok-{uuid.uuid4().hex}"
    with httpx.Client(base_url=url, trust_env=False, timeout=10) as http:
        in_url = http.get("/api/runs", params={"token": VIEWER, "status": "done"})
        other = http.get("/api/runs", params={"access_token": secret})
        header = http.get("/api/runs", headers={"Authorization": f"Bearer {VIEWER}"})
        unknown = http.get("/api/runs", headers={"Authorization": f"Bearer {secret}"})
    assert in_url.status_code == other.status_code == unknown.status_code == 401
    assert "never taken from the URL" in in_url.json()["detail"]
    assert header.status_code == 200

    deadline = time.monotonic() + 10
    while log.read_text().count('"GET /api/runs') < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    written = log.read_text()
    assert '"GET /api/runs?token=***&status=done HTTP/1.1" 401' in written, written
    assert '"GET /api/runs?access_token=*** HTTP/1.1" 401' in written
    assert VIEWER not in written
    assert secret not in written

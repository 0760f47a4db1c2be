"""Traces: one per run, from its start through every turn, the suspension, the decision and
the resume, its context in the store and in the turn messages' headers; in eager mode
(the in-memory exporter) and through a real worker (which writes its spans to a file)."""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlmodel import select

from relayq import Agent, Answer, Request
from relayq.providers import ProviderModel
from relayq.relay import RelayResult, relay_answer, relay_calls_of
from store import Database, RunRow, RunSpec, create_run
from tasks import DurableClient, Settings
from tasks.observability import tracing
from tests import forkserver
from tests.durable.observed_agents import KEY_ENV, metered_agent, metered_reply
from tests.provider_server import API_KEY, ProviderServer

from .conftest import Durable, Eventually, SpareWorkers

SECRET_OUTPUT = "the vault code is 4471"


@pytest.fixture(scope="module")
def provider() -> Iterator[ProviderServer]:
    with ProviderServer(metered_reply) as server:
        yield server


@pytest.fixture
async def metered(provider: ProviderServer) -> AsyncIterator[Agent]:
    """The `metered` agent on the provider, for an eager host: its connections closed after."""
    agent = metered_agent(provider.openai_url, register=False)
    yield agent
    assert isinstance(agent.durable_model, ProviderModel)
    await agent.durable_model.aclose()


@pytest.fixture
async def eager(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[DurableClient]:
    monkeypatch.setenv(KEY_ENV, API_KEY)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    settings = Settings.load(
        env={
            "RELAYQ_HOME": str(tmp_path),
            "RELAYQ_DATABASE_URL": database_url,
            "RELAYQ_BROKER_URL": "redis://127.0.0.1:1/0",
            "RELAYQ_RETRY_BASE": "0.01",
        }
    )
    client = DurableClient(eager=True, settings=settings)
    yield client
    client.close()


def answer_all(request: Request | None, output: str = SECRET_OUTPUT) -> Answer:
    assert request is not None
    results = [RelayResult(id=c.id, output=output) for c in relay_calls_of(request)]
    return relay_answer(request.id, results)


def of_run(spans: list[ReadableSpan], run_id: str) -> list[ReadableSpan]:
    """The spans of the run's trace, in the order they started."""
    root = next(s for s in spans if s.name == "relayq.run" and _attr(s, "relayq.run_id") == run_id)
    assert root.context is not None
    trace_id = root.context.trace_id
    mine = [s for s in spans if s.context is not None and s.context.trace_id == trace_id]
    return sorted(mine, key=lambda s: s.start_time or 0)


def _attr(span: ReadableSpan, key: str) -> Any:
    return (span.attributes or {}).get(key)


def stored_context(db: Database, run_id: str) -> str | None:
    with db.read() as s:
        return s.exec(select(RunRow.trace_context).where(RunRow.id == run_id)).one()


def assert_nothing_secret(records: list[dict[str, Any]], *texts: str) -> None:
    for record in records:
        flat = json.dumps(record)
        for text in texts:
            assert text not in flat, f"{text!r} in {record['name']}"


def as_records(spans: list[ReadableSpan]) -> list[dict[str, Any]]:
    return [{"name": s.name, "attributes": dict(s.attributes or {})} for s in spans]


async def test_an_eager_run_is_one_trace_from_its_start_through_the_decision_to_its_end(
    eager: DurableClient, spans: InMemorySpanExporter, metered: Agent
):
    # Given a traced eager host, and an agent on a real provider with a relay tool
    agent = metered
    prompt = f"please confirm order {uuid.uuid4().hex[:8]}"

    # When a run halts on its request, a person answers it, and the run ends
    halted = await eager.run(agent, prompt)
    assert halted.status == "pending"
    assert halted.pending is not None
    assert halted.run_id is not None
    done = await eager.run_with_answer(halted.pending, answer_all(halted.pending))
    assert done.status == "done"

    # Then every span of the run is in one trace, each a child of the run's root
    trace = of_run(list(spans.get_finished_spans()), halted.run_id)
    names = [s.name for s in trace]
    assert sorted(names) == sorted(
        [
            *("relayq.run", "relayq.turn", "relayq.model", "relayq.decision"),
            *("relayq.suspension", "relayq.resume", "relayq.turn", "relayq.model"),
        ]
    ), names
    root = trace[0]
    assert root.name == "relayq.run"
    assert root.parent is None
    assert root.context is not None
    by_id = {s.context.span_id: s for s in trace if s.context is not None}
    for span in trace[1:]:
        assert span.parent is not None
        parent = by_id[span.parent.span_id]
        assert parent.name == ("relayq.turn" if span.name == "relayq.model" else "relayq.run")
    # ... the store keeps the root's context ...
    traceparent = stored_context(eager.db, halted.run_id) or ""
    assert traceparent.startswith(f"00-{root.context.trace_id:032x}-{root.context.span_id:016x}-")
    # ... the turns say how they ended and which request the first halted on ...
    turns = [s for s in trace if s.name == "relayq.turn"]
    assert [_attr(s, "relayq.outcome") for s in turns] == ["pending", "done"]
    assert _attr(turns[0], "relayq.request_id") == halted.pending.id
    # ... the suspension spans the request's life, and the model calls their tokens
    stored = (await eager.requests(None, run_id=halted.run_id)).items[0]
    suspension = next(s for s in trace if s.name == "relayq.suspension")
    assert suspension.start_time == int(stored.created_at.timestamp() * 1e9)
    assert stored.answered_at is not None
    assert suspension.end_time == int(stored.answered_at.timestamp() * 1e9)
    assert _attr(suspension, "relayq.request.status") == "answered"
    models = [s for s in trace if s.name == "relayq.model"]
    assert sorted(_attr(s, "gen_ai.usage.input_tokens") for s in models) == [11, 20]
    assert {_attr(s, "server.address") for s in models} == {"127.0.0.1"}
    decision = next(s for s in trace if s.name == "relayq.decision")
    assert _attr(decision, "relayq.request_id") == halted.pending.id
    assert _attr(decision, "relayq.decision.resolved") is True
    # ... and no span carries the prompt, the tool's arguments or the answer
    order = prompt.split()[-1]
    assert_nothing_secret(as_records(trace), prompt, order, SECRET_OUTPUT, API_KEY)


async def test_a_run_started_inside_a_host_span_gets_a_trace_of_its_own_linked_to_it(
    eager: DurableClient, spans: InMemorySpanExporter, metered: Agent
):
    agent = metered
    tracer = tracing._tracer()
    with tracer.start_as_current_span("host.request") as host:
        run_id = await eager.start(agent, f"confirm order {uuid.uuid4().hex[:8]}")

    root = of_run(list(spans.get_finished_spans()), run_id)[0]
    assert root.context is not None
    assert root.context.trace_id != host.get_span_context().trace_id
    assert [link.context.span_id for link in root.links] == [host.get_span_context().span_id]


async def test_with_tracing_off_no_span_is_made_and_the_run_keeps_no_context(
    eager: DurableClient, metered: Agent, monkeypatch: pytest.MonkeyPatch
):
    # Given no tracer provider configured, and RELAYQ_OTEL unset
    monkeypatch.delenv(tracing.OTEL_ENV, raising=False)
    assert not tracing.enabled()
    agent = metered

    halted = await eager.run(agent, f"confirm order {uuid.uuid4().hex[:8]}")

    assert halted.status == "pending"
    assert halted.run_id is not None
    assert stored_context(eager.db, halted.run_id) is None


# -- through a real worker ---------------------------------------------------------------------


def read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


async def test_a_run_on_a_real_worker_is_one_trace_carried_by_the_store_and_the_task_headers(
    durable: Durable,
    spare_workers: SpareWorkers,
    spans: InMemorySpanExporter,
    provider: ProviderServer,
    tmp_path: Path,
    eventually: Eventually,
):
    # Given a worker whose host traces to a file, and a traced host here
    worker_spans = tmp_path / "spans.jsonl"
    spare = spare_workers.start(
        RELAYQ_AGENTS="tests.durable.agents,tests.durable.observed_agents,tests.durable.traced_worker",
        RELAYQ_TEST_PROVIDER_URL=provider.openai_url,
        RELAYQ_TEST_PROVIDER_KEY=API_KEY,
        RELAYQ_TEST_SPANS=str(worker_spans),
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
    )
    prompt = f"please throttle then confirm order {uuid.uuid4().hex[:8]}"
    async with DurableClient(settings=spare.settings) as client:
        # When a run is throttled once, halts on its request, is answered and ends
        run_id = await client.start("metered", prompt)
        halted = await client.result(run_id, wait=True, timeout=30)
        assert halted.status == "pending", halted.error
        await client.submit_answer(answer_all(halted.pending))

        async def finished() -> bool:
            return (await client.result(run_id)).status == "done"

        await eventually(finished, what="the run to finish")

    # Then the host's root and decision, and the worker's turns, model calls, suspension
    # and resume, are one trace, every span a child of the root (or a model call of a turn)
    host = as_dicts(list(spans.get_finished_spans()))
    root = next(
        s for s in host if s["name"] == "relayq.run" and s["attributes"]["relayq.run_id"] == run_id
    )

    def worker_trace() -> list[dict[str, Any]]:
        found = [s for s in read_lines(worker_spans) if s["trace_id"] == root["trace_id"]]
        return found if len([s for s in found if s["name"] == "relayq.turn"]) == 3 else []

    try:
        remote = await eventually(worker_trace, what="the worker's spans")
    except pytest.fail.Exception:
        # Say what the worker did write: which spans, in which traces (a full suite's run
        # once found fewer or more than the three turns in the root's trace).
        wrote = [(s["trace_id"][:8], s["name"], s["parent_id"]) for s in read_lines(worker_spans)]
        pytest.fail(
            f"the worker's three turns in the root's trace {root['trace_id'][:8]} did not come "
            f"within 30 s; it wrote {wrote}"
        )
    trace = [s for s in host if s["trace_id"] == root["trace_id"]] + remote
    names = sorted(s["name"] for s in trace)
    assert names == sorted(
        ["relayq.run", "relayq.decision", "relayq.suspension", "relayq.resume"]
        + ["relayq.turn"] * 3
        + ["relayq.model"] * 3
    ), names
    turns = {s["span_id"] for s in trace if s["name"] == "relayq.turn"}
    for span in trace:
        if span["name"] == "relayq.model":
            assert span["parent_id"] in turns
        elif span is not root:
            assert span["parent_id"] == root["span_id"], span["name"]
    outcomes = sorted(
        s["attributes"]["relayq.outcome"] for s in trace if s["name"] == "relayq.turn"
    )
    assert outcomes == ["done", "pending", "retry"]
    statuses = sorted(s["status"] for s in trace if s["name"] == "relayq.model")
    assert statuses == ["ERROR", "UNSET", "UNSET"]
    # ... the store keeps the root's context, and every turn message carried it as a header
    db = spare.db()
    try:
        traceparent = stored_context(db, run_id) or ""
    finally:
        db.dispose()
    assert traceparent.startswith(f"00-{root['trace_id']}-{root['span_id']}-")
    headers = [
        h for h in read_lines(worker_spans.with_suffix(".headers")) if h["args"][:1] == [run_id]
    ]
    assert len(headers) == 3
    assert {h["traceparent"] for h in headers} == {traceparent}
    # ... and nothing of the prompt or the answer went into a span
    assert_nothing_secret(trace, prompt, SECRET_OUTPUT, API_KEY)


def test_a_root_another_process_stored_first_is_never_exported(
    eager: DurableClient, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
):
    # Given a queued run with no trace yet, and another process (a worker's sweep resending
    # its first turn) storing the run's trace just before this one does
    run_id = f"run_{uuid.uuid4().hex}"
    create_run(eager.db, RunSpec(agent="metered"), run_id=run_id, prompt="hello")
    theirs = f"00-{'a' * 32}-{'b' * 16}-01"
    keep = tracing.keep_trace_contexts

    def after_theirs(db: Database, contexts: dict[str, str]) -> dict[str, str]:
        keep(db, {run_id: theirs})
        return keep(db, contexts)

    monkeypatch.setattr(tracing, "keep_trace_contexts", after_theirs)

    # When this process gives the run its trace
    found = tracing._contexts(eager.db, [run_id])

    # Then the run's trace is theirs, and the root this process began is not exported
    assert found[run_id].traceparent == theirs
    roots = [
        s
        for s in spans.get_finished_spans()
        if s.name == "relayq.run" and (s.attributes or {}).get("relayq.run_id") == run_id
    ]
    assert roots == []


def as_dicts(spans: list[ReadableSpan]) -> list[dict[str, Any]]:
    out = []
    for s in spans:
        assert s.context is not None
        out.append(
            {
                "name": s.name,
                "trace_id": f"{s.context.trace_id:032x}",
                "span_id": f"{s.context.span_id:016x}",
                "parent_id": f"{s.parent.span_id:016x}" if s.parent else None,
                "attributes": dict(s.attributes or {}),
                "status": s.status.status_code.name,
            }
        )
    return out


RELAYQ_OTEL_SCRIPT = """
import asyncio, sys
from relayq import Agent, InProcessResponse
from tasks import DurableClient, Settings
from tasks.observability import tracing

assert tracing.enabled()
agent = Agent("otel-env", lambda req: InProcessResponse(content="hi"), register=False)
settings = Settings.load(env={"RELAYQ_HOME": sys.argv[1], "RELAYQ_BROKER_URL": "redis://127.0.0.1:1/0"})

async def main():
    async with DurableClient(eager=True, settings=settings) as client:
        print("status", (await client.run(agent, "a prompt kept out of spans")).status, flush=True)

asyncio.run(main())
"""


def test_relayq_otel_1_sets_the_sdk_up_with_the_exporter_the_environment_names(tmp_path: Path):
    env = {**os.environ, tracing.OTEL_ENV: "1", "OTEL_TRACES_EXPORTER": "console"}
    out = forkserver.run(
        [sys.executable, "-c", RELAYQ_OTEL_SCRIPT, str(tmp_path)],
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "status done" in out
    for name in ("relayq.run", "relayq.turn", "relayq.model"):
        assert f'"name": "{name}"' in out, out
    assert '"service.name": "relayq"' in out
    assert "a prompt kept out of spans" not in out

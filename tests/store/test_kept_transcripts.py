"""A worker keeps the transcript of a run whose next turn it queued: the claim of that turn
reads none of it, and anything that changed the run meanwhile makes the claim read it whole."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event

from relayq import Agent
from relayq.relay import RelayResult, relay_answer
from store import Database, accept_answer, apply_answer_of, get_run, transcript
from tasks.runner.transcripts import Transcripts
from tasks.runner.turn.task import drive_turn
from tests.relayq.scripted import calls, text

from .driver import local_kit, model_of, relay_kit, relay_turn, runtime, start, statements


def reads_of_messages(seen: list[str]) -> list[str]:
    return [s for s in seen if s.lstrip().upper().startswith("SELECT") and "relayq_messages" in s]


async def _agent(db: Database, *replies: Any) -> Agent:
    kit = await local_kit()
    return Agent(get_run(db, "run_1").agent, model_of(*replies), tools=kit.tools, register=False)


async def test_the_next_turn_on_the_same_worker_reads_no_message(db: Database):
    start(db)
    agent = await _agent(db, calls(("c1", "work")), calls(("c2", "work")), text("done"))
    rt = runtime(db, agent)

    await drive_turn(rt, None, "run_1", get_run(db, "run_1").version)
    assert len(rt.transcripts) == 1
    with statements(db) as seen:
        outcome = await drive_turn(rt, None, "run_1", get_run(db, "run_1").version)
    assert outcome.summary == "next"
    assert reads_of_messages(seen) == []

    # The transcript the worker kept is the one stored, turn after turn
    await drive_turn(rt, None, "run_1", get_run(db, "run_1").version)
    assert get_run(db, "run_1").status == "done"
    assert len(rt.transcripts) == 0, "a finished run's transcript is not kept"
    [*_, last] = transcript(db, "run_1")
    assert last["content"] == "done"


async def test_a_turn_taken_elsewhere_meanwhile_makes_the_claim_read_the_transcript(db: Database):
    start(db)
    replies = [calls(("c1", "work")), calls(("c2", "work")), text("done")]
    agent = await _agent(db, *replies)
    here, elsewhere = runtime(db, agent), runtime(db, agent)

    await drive_turn(here, None, "run_1", get_run(db, "run_1").version)
    await drive_turn(elsewhere, None, "run_1", get_run(db, "run_1").version)
    # `here` kept the transcript at a version the run has left: it is not used
    with statements(db) as seen:
        await drive_turn(here, None, "run_1", get_run(db, "run_1").version)
    assert reads_of_messages(seen) != []
    stored = transcript(db, "run_1")
    assert [m["role"] for m in stored] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert stored[-1]["content"] == "done"


async def test_an_answer_applied_meanwhile_makes_the_claim_read_the_transcript(db: Database):
    start(db)
    kit = await relay_kit("lookup")
    agent = Agent(
        "agent",
        model_of(relay_turn(("c1", "lookup")), text("done")),
        tools=kit.tools,
        register=False,
    )
    rt = runtime(db, agent)
    outcome = await drive_turn(rt, None, "run_1", get_run(db, "run_1").version)
    assert outcome.turn is not None
    assert outcome.turn.pending is not None
    assert len(rt.transcripts) == 0, "a run waiting on its host is not kept"

    request = outcome.turn.pending
    accept_answer(db, relay_answer(request.id, [RelayResult(id="c1", output="found")]))
    apply_answer_of(db, request.id)
    with statements(db) as seen:
        done = await drive_turn(rt, None, "run_1", get_run(db, "run_1").version)
    assert reads_of_messages(seen) != []
    assert done.summary == "done"
    assert transcript(db, "run_1")[2]["content"] == "found"


def test_kept_transcripts_are_taken_once_at_their_version_and_the_oldest_dropped():
    kept = Transcripts(size=2)
    kept.keep("a", 3, [{"role": "user"}])
    assert kept.take("a", 4) is None, "another version"
    assert kept.take("a", 3) is None, "taken (or refused) once"
    kept.keep("a", 1, [])
    kept.keep("b", 1, [])
    kept.keep("c", 1, [])
    assert len(kept) == 2
    assert kept.take("a", 1) is None
    assert kept.take("c", 1) == []


async def test_a_claim_with_the_transcript_kept_is_one_statement_outside_a_transaction(
    db: Database,
):
    # On PostgreSQL the claim's UPDATE goes alone, committed by itself: one round trip, no
    # BEGIN or COMMIT (SQLite's cost none: there it stays a transaction, its lock taken).
    start(db)
    agent = await _agent(db, calls(("c1", "work")), text("done"))
    rt = runtime(db, agent)
    await drive_turn(rt, None, "run_1", get_run(db, "run_1").version)
    claims: list[tuple[str, bool]] = []

    def note(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE RELAYQ_RUNS"):
            driver = conn.connection.dbapi_connection
            alone = driver.autocommit if not db.is_sqlite else driver.in_transaction
            claims.append((statement.split("RETURNING")[0], alone))

    for engine in db.engines:
        event.listen(engine, "before_cursor_execute", note)
    try:
        await drive_turn(rt, None, "run_1", get_run(db, "run_1").version)
    finally:
        for engine in db.engines:
            event.remove(engine, "before_cursor_execute", note)
    assert get_run(db, "run_1").status == "done"
    (claim, alone), *rest = claims
    assert "status=" in claim.replace(" ", ""), claims
    assert alone, claims
    # The turn's finish is a transaction of several statements, as before
    assert rest, claims
    assert db.is_sqlite or not any(alone for _, alone in rest), claims

"""What a turn writes, and in how many transactions: a reply that runs no tool of ours, and a
tool outcome with no other call of its turn running, go with the turn's end; the outbox keeps
only the messages still to take effect; a run asked to cancel as its turn suspends is cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event

from relayq import Agent, InProcessResponse, ToolContext, ToolResult, Usage, define_tool
from relayq.relay import RelayResult, relay_answer
from store import (
    Database,
    accept_answer,
    apply_answer_of,
    cancel_run,
    get_run,
    ledger_get,
    migrate,
    transcript,
)
from store.db import SQLITE_PAGE_SIZE
from tasks.runner.turn.task import drive_turn
from tests.relayq.scripted import calls, text

from .driver import (
    local_kit,
    model_of,
    outbox_rows,
    relay_kit,
    relay_turn,
    request_rows,
    run_turn,
    runtime,
    start,
)


@contextmanager
def transactions(db: Database) -> Iterator[list[list[str]]]:
    """The statements of each transaction committed while open, in order."""
    done: list[list[str]] = []
    current: list[str] = []

    def note(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        current.append(" ".join(statement.split()).upper())

    def commit(conn: Any) -> None:
        if current:
            done.append(list(current))
        current.clear()

    def rollback(conn: Any) -> None:
        current.clear()

    hooks = (("before_cursor_execute", note), ("commit", commit), ("rollback", rollback))
    listeners = [(engine, name, fn) for engine in db.engines for name, fn in hooks]
    for listener in listeners:
        event.listen(*listener)
    try:
        yield done
    finally:
        for listener in listeners:
            event.remove(*listener)


def writes(done: list[list[str]]) -> list[list[str]]:
    """The transactions that wrote something."""
    verbs = ("INSERT", "UPDATE", "DELETE")
    return [t for t in done if any(s.startswith(verbs) for s in t)]


def moves_status(statements: list[str]) -> bool:
    return any(s.startswith("UPDATE RELAYQ_RUNS SET STATUS") for s in statements)


def records_outcome(statements: list[str]) -> bool:
    return any(s.startswith("INSERT INTO RELAYQ_LEDGER") and "OUTCOME =" in s for s in statements)


async def test_a_turn_that_runs_one_tool_writes_three_transactions_its_outcome_in_the_last(
    db: Database,
):
    kit = await local_kit()
    start(db)
    with transactions(db) as done:
        turn = await run_turn(db, "run_1", kit, model_of(calls(("c1", "work")), text("done")))
    assert turn.status == "next"

    # claim; the reply with its call counted as started; the end with the tool's outcome
    claim, reply, end = writes(done)
    assert moves_status(claim)
    assert moves_status(end)
    assert not moves_status(reply)
    assert any(s.startswith("INSERT INTO RELAYQ_MESSAGES") for s in reply)
    assert records_outcome(end)
    assert not records_outcome(reply)
    outcome = ledger_get(db, "run_1", 1, "c1", "")
    assert isinstance(outcome, ToolResult)
    assert outcome.output == "ran c1"


async def test_a_final_reply_is_written_with_the_turns_end_and_counted_once(db: Database):
    kit = await local_kit()
    start(db)
    usage = Usage(prompt_tokens=11, completion_tokens=4, total_tokens=15)
    model = model_of(InProcessResponse(content="all done", usage=usage))
    with transactions(db) as done:
        turn = await run_turn(db, "run_1", kit, model)

    assert turn.status == "done"
    claim, end = writes(done)
    assert moves_status(claim)
    assert moves_status(end)
    run = get_run(db, "run_1")
    assert (run.status, run.text, run.turns, run.total_tokens) == ("done", "all done", 1, 15)
    assert (run.prompt_tokens, run.completion_tokens) == (11, 4)
    assert [m["role"] for m in transcript(db, "run_1")] == ["user", "assistant"]


async def test_a_reply_of_relay_calls_is_written_with_the_request_it_opens(db: Database):
    kit = await relay_kit("lookup")
    start(db)
    with transactions(db) as done:
        turn = await run_turn(db, "run_1", kit, model_of(relay_turn(("c1", "lookup"))))

    assert turn.status == "pending"
    _claim, end = writes(done)
    assert any(s.startswith("INSERT INTO RELAYQ_REQUESTS") for s in end)
    assert any(s.startswith("INSERT INTO RELAYQ_MESSAGES") for s in end)
    assert get_run(db, "run_1").turns == 1


async def test_an_outcome_is_recorded_at_once_while_another_call_of_its_turn_still_runs(
    db: Database,
):
    # Given two tools called together: `quick` ends first, `slow` looks at the ledger
    seen: list[Any] = []
    quick_done = asyncio.Event()

    def quick(args: dict[str, Any], ctx: ToolContext) -> str:
        return "quick done"

    async def slow(args: dict[str, Any], ctx: ToolContext) -> str:
        # Until quick's outcome is in the ledger: stored at the turn's end, it never is.
        deadline = asyncio.get_running_loop().time() + 10
        while (recorded := ledger_get(db, "run_1", 1, "c1", "")) is None:
            assert asyncio.get_running_loop().time() < deadline, "quick's outcome not stored"
            await asyncio.sleep(0.01)
        seen.append(recorded)
        quick_done.set()
        return "slow done"

    tools = [define_tool("quick", "q", None, quick), define_tool("slow", "s", None, slow)]
    start(db)
    model = model_of(calls(("c1", "quick"), ("c2", "slow")))
    agent = Agent("agent", model, tools=tools, register=False)
    rt = runtime(db, agent)

    await drive_turn(rt, None, "run_1", get_run(db, "run_1").version)

    # Then quick's outcome was stored while slow ran (slow could have killed the worker)
    assert quick_done.is_set()
    [recorded] = seen
    assert isinstance(recorded, ToolResult)
    assert recorded.output == "quick done"
    last = ledger_get(db, "run_1", 1, "c2", "")
    assert isinstance(last, ToolResult)
    assert last.output == "slow done"


async def test_the_outbox_keeps_one_message_per_unfinished_run_and_none_once_it_ends(
    db: Database,
):
    kit = await local_kit()
    start(db)
    model = model_of(calls(("c1", "work")), calls(("c2", "work")), text("done"))

    for _ in range(2):
        await run_turn(db, "run_1", kit, model)
        run = get_run(db, "run_1")
        # The newest message alone: the earlier ones have had their effect
        [row] = outbox_rows(db)
        assert row.args == ["run_1", run.version]
    await run_turn(db, "run_1", kit, model)

    assert get_run(db, "run_1").status == "done"
    assert outbox_rows(db) == []


async def test_an_applied_answer_leaves_the_outbox_its_next_turn_alone(db: Database):
    kit = await relay_kit("lookup")
    start(db)
    turn = await run_turn(db, "run_1", kit, model_of(relay_turn(("c1", "lookup"))))
    assert turn.pending is not None
    accept_answer(db, relay_answer(turn.pending.id, [RelayResult(id="c1", output="42")]))
    assert {r.task for r in outbox_rows(db)} == {"relayq.run_turn", "relayq.submit_answer"}

    [sent] = apply_answer_of(db, turn.pending.id)

    assert outbox_rows(db) == [sent]


async def test_a_run_asked_to_cancel_while_its_turn_runs_is_cancelled_not_suspended(
    db: Database,
):
    # Given a run whose model is called, and a cancel that arrives during the call
    kit = await relay_kit("lookup")
    start(db)

    def reply_after_a_cancel(*_: Any) -> Any:
        assert cancel_run(db, "run_1") == "running"
        return relay_turn(("c1", "lookup"))

    # When the turn ends on a relay call
    await run_turn(db, "run_1", kit, model_of(reply_after_a_cancel))

    # Then the run is cancelled, and no request waits on anyone
    assert get_run(db, "run_1").status == "cancelled"
    assert [r.status for r in request_rows(db)] == []
    assert outbox_rows(db) == []


async def test_an_outbox_id_names_one_message_ever_though_spent_rows_are_deleted(db: Database):
    # Given a run that finished: its messages' rows are gone, the newest id among them
    kit = await local_kit()
    start(db)
    first = outbox_rows(db)[0].id or 0
    await run_turn(db, "run_1", kit, model_of(text("done")))
    assert outbox_rows(db) == []

    # When another run is started, its message's id is a new one (task id relayq-<id>)
    start(db, run_id="run_2")
    [row] = outbox_rows(db)

    assert (row.id or 0) > first


async def test_a_turn_that_runs_one_tool_logs_at_most_24_kib_to_sqlites_write_ahead_log(
    tmp_path: Path,
):
    # A new store's pages are 1 KiB, and no index is kept that no query reads: the log
    # takes each changed page whole, so the page size and every index a turn moves count.
    db = Database(f"sqlite:///{tmp_path / 'relayq.db'}")
    try:
        migrate(db)
        with db.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA page_size").scalar() == SQLITE_PAGE_SIZE == 1024
            # ... and the log is checkpointed each 4 MiB, as with SQLite's default pages
            assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 4096
            indexes = conn.exec_driver_sql("PRAGMA index_list(relayq_runs)").all()
            assert "ix_relayq_runs_lease_until" not in {row[1] for row in indexes}
        kit = await local_kit()
        start(db)
        await run_turn(db, "run_1", kit, model_of(calls(("c0", "work")), text("done")))
        wal = tmp_path / "relayq.db-wal"
        before = wal.stat().st_size
        # The run's second turn: claim, reply, end (the worker's transcript not kept here)
        turn = await run_turn(db, "run_1", kit, model_of(calls(("c1", "work")), text("done")))
        assert turn.status == "next"
        written = wal.stat().st_size - before
        assert 0 < written <= 24 * 1024, written
    finally:
        db.dispose()

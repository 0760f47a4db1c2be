"""Rules 4, 5 and 6: what a turn writes, and when."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from relayq import InProcessResponse, Request, ToolResult, Usage, pending
from relayq.loop import take_turn
from relayq.relay import RelayResult, relay_answer
from store import (
    Database,
    LedgerRow,
    MessageRow,
    accept_answer,
    apply_answer_of,
    claim_turn,
    finish_turn,
    get_run,
    ledger_get,
    ledger_put,
    save_reply,
    settled,
    transcript,
)
from store.models import utcnow
from tests.relayq.scripted import call, calls, text

from .driver import (
    LEASE,
    TURN_TASK,
    halt_on_relay,
    journal,
    local_kit,
    message_rows,
    model_of,
    outbox_rows,
    relay_kit,
    request_rows,
    run_turn,
    start,
)


def kept(rows: list[MessageRow]) -> dict[int, tuple[Any, datetime]]:
    return {r.seq: (r.body, r.created_at) for r in rows}


# Rule 4


@pytest.mark.parametrize("tool_calls", [1, 4])
async def test_each_turn_adds_one_row_per_new_message_and_never_rewrites_earlier_ones(
    db: Database, tool_calls: int
):
    # Given a model that calls a local tool `tool_calls` times, one call a turn, then answers
    kit = await local_kit()
    model = model_of(*[calls((f"c{k}", "work")) for k in range(tool_calls)], text("done"))
    start(db)
    earlier = kept(message_rows(db))

    for _ in range(tool_calls + 1):
        # When it takes one more turn
        turn = await run_turn(db, "run_1", kit, model)

        # Then the table holds the transcript, one row a message, and the old rows as they were
        rows = message_rows(db)
        assert [r.seq for r in rows] == list(range(len(turn.messages)))
        assert [r.body for r in rows] == turn.messages == transcript(db, "run_1")
        assert {seq: kept(rows)[seq] for seq in earlier} == earlier
        earlier = kept(rows)

    assert turn.status == "done"
    assert len(earlier) == 1 + 2 * tool_calls + 1
    assert get_run(db, "run_1").status == "done"


async def test_an_answer_replaces_the_placeholders_in_place_and_nothing_else(db: Database):
    # Given a run halted on two relay calls
    kit = await relay_kit("lookup")
    halted_model = model_of(
        InProcessResponse(tool_calls=[call("c1", "lookup"), call("c2", "lookup")]), text("ok")
    )
    start(db)
    turn = await run_turn(db, "run_1", kit, halted_model)
    assert turn.pending is not None
    before = kept(message_rows(db))
    placeholders = {i for i, m in enumerate(turn.messages) if "pending" in m.get("relayq", {})}
    assert placeholders == {2, 3}

    # When the answer is applied and the next turn runs
    answer = relay_answer(
        turn.pending.id,
        [RelayResult(id="c1", output="one"), RelayResult(id="c2", output="two")],
    )
    accept_answer(db, answer)
    apply_answer_of(db, turn.pending.id)
    after_answer = kept(message_rows(db))
    await run_turn(db, "run_1", kit, halted_model)

    # Then only the placeholders' rows changed, where they were
    assert set(after_answer) == set(before)
    changed = {seq for seq in before if after_answer[seq][0] != before[seq][0]}
    assert changed == placeholders
    assert [after_answer[seq][0]["content"] for seq in sorted(placeholders)] == ["one", "two"]
    assert all(after_answer[seq][1] == before[seq][1] for seq in before)
    final = kept(message_rows(db))
    assert {seq: final[seq] for seq in after_answer} == after_answer
    assert len(final) == len(before) + 1


# Rule 5


async def test_the_model_reply_is_stored_before_its_tools_run(db: Database):
    seen: list[dict[str, Any]] = []
    kit = await local_kit(on_call=lambda ctx: seen.append(transcript(db, "run_1")[-1]))
    start(db)

    await run_turn(db, "run_1", kit, model_of(calls(("c1", "work"))))

    assert len(seen) == 1
    assert seen[0]["role"] == "assistant"
    assert [c["id"] for c in seen[0]["tool_calls"]] == ["c1"]


def test_save_reply_appends_the_reply_to_the_stored_transcript(db: Database):
    start(db)
    held = claim_turn(db, "run_1", 0, task_id="t", lease=LEASE)
    assert held is not None
    before = transcript(db, "run_1")
    reply = {"role": "assistant", "content": "thinking", "tool_calls": []}

    save_reply(db, held, [*before, reply])

    assert transcript(db, "run_1") == [*before, reply]
    assert [r.role for r in message_rows(db)] == ["user", "assistant"]


async def test_a_redelivered_turn_replays_the_saved_reply_and_the_ledger(db: Database):
    # Given a turn that saved its reply and ran its first tool, then its worker died
    runs: list[str] = []
    kit = await local_kit(on_call=lambda ctx: runs.append(ctx.call_id))
    model = model_of(calls(("c1", "work"), ("c2", "work")), text("done"))
    start(db)
    dead = claim_turn(db, "run_1", 0, task_id="task-1", lease=LEASE)
    assert dead is not None
    before = transcript(db, "run_1")
    await take_turn(before, kit, model, run_id="run_1", journal=journal(db, dead))
    assert runs == ["c1", "c2"]
    # (forget the second call, as if the worker died before it finished)
    with db.write() as s:
        row = s.get(LedgerRow, ("run_1", 1, "c2", ""))
        assert row is not None
        s.delete(row)

    # When the broker redelivers the task
    again = claim_turn(db, "run_1", 0, task_id="task-1", lease=LEASE)
    assert again is not None
    saved = transcript(db, "run_1")
    turn = await take_turn(saved, kit, model, run_id="run_1", journal=journal(db, again))
    finish_turn(db, again, saved, turn, tools_digest="d")

    # Then the model is not asked again and only the unfinished call runs again
    assert turn.model_called is False
    assert runs == ["c1", "c2", "c2"]
    assert [m["content"] for m in transcript(db, "run_1")[2:]] == ["ran c1", "ran c2"]


OUTCOMES: dict[str, ToolResult | Request] = {
    "result": ToolResult(output="42"),
    "error": ToolResult.error("boom"),
    "request": Request(
        id="req_1",
        kind="approval",
        prompt="Deploy?",
        url="https://example.test/r/1",
        data={"service": "api", "nested": {"a": [1, 2]}},
        expires_at=datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
    ),
    "pending helper": pending("question", "Why?", expires_in=timedelta(hours=1)),
}


@pytest.mark.parametrize("outcome", OUTCOMES.values(), ids=OUTCOMES.keys())
def test_the_ledger_returns_what_was_put(db: Database, outcome: ToolResult | Request):
    assert ledger_get(db, "run_1", 1, "c1", "") is None

    ledger_put(db, "run_1", 1, "c1", "", outcome)

    got = ledger_get(db, "run_1", 1, "c1", "")
    assert type(got) is type(outcome)
    assert got == outcome


def test_the_ledger_keeps_the_first_outcome_of_a_call(db: Database):
    ledger_put(db, "run_1", 1, "c1", "", ToolResult(output="first"))

    ledger_put(db, "run_1", 1, "c1", "", ToolResult(output="second"))
    ledger_put(db, "run_1", 1, "c1", "", Request(kind="approval", prompt="?"))

    assert ledger_get(db, "run_1", 1, "c1", "") == ToolResult(output="first")


def test_the_ledger_keys_a_call_by_where_it_was_made_and_its_attempt(db: Database):
    keys = [("run_1", 1, "c1", ""), ("run_1", 3, "c1", ""), ("run_1", 1, "c1", "req_9"),
            ("run_2", 1, "c1", ""), ("run_1", 1, "c2", "")]  # fmt: skip
    for n, key in enumerate(keys):
        ledger_put(db, *key, ToolResult(output=str(n)))

    assert [ledger_get(db, *key) for key in keys] == [
        ToolResult(output=str(n)) for n in range(len(keys))
    ]


# Rule 6


async def test_a_next_turn_queues_the_run_at_the_next_version_with_one_turn_message(db: Database):
    kit = await local_kit()
    start(db, prompt="the secret plans of the prompt")
    assert all("secret" not in row.label for row in outbox_rows(db)), "nor create_run's"
    held = claim_turn(db, "run_1", 0, task_id="t", lease=LEASE)
    assert held is not None
    before = transcript(db, "run_1")
    turn = await take_turn(
        before, kit, model_of(calls(("c1", "work"))), run_id="run_1", journal=journal(db, held)
    )
    sent = finish_turn(db, held, before, turn, tools_digest="d")

    run = get_run(db, "run_1")
    assert (run.status, run.version, run.turns) == ("queued", held.version + 1, 1)
    assert (run.claimed_by, run.lease_until, run.tools_digest) == (None, None, "d")
    # The outbox holds the new message alone: create_run's has had its effect
    new = outbox_rows(db)
    assert len(new) == len(sent) == 1
    assert (new[0].task, new[0].args, new[0].run_id) == (TURN_TASK, ["run_1", run.version], "run_1")
    assert new[0].id == sent[0].id
    assert "secret" not in new[0].label
    assert "ran c1" not in new[0].label
    assert "run_1" in new[0].label
    assert settled(db, "run_1") == ("queued", False)


async def test_a_pending_turn_opens_one_request_for_all_its_relay_calls(db: Database):
    t0 = utcnow()
    _, _, turn = await halt_on_relay(
        db, "c1", "c2", "c3", request_ttl=timedelta(minutes=10), on_expiry="cancel"
    )
    t1 = utcnow()

    run = get_run(db, "run_1")
    assert run.status == "pending"
    [row] = request_rows(db)
    assert turn.pending is not None
    assert row.id == turn.pending.id
    assert (row.kind, row.status, row.on_expiry, row.agent) == (
        "tool_call",
        "open",
        "cancel",
        "agent",
    )
    assert [c["id"] for c in row.calls] == ["c1", "c2", "c3"]
    assert [c["input"] for c in row.calls] == [{"n": "c1"}, {"n": "c2"}, {"n": "c3"}]
    assert "calls" not in row.data
    assert row.expires_at is not None
    assert t0 + timedelta(minutes=10) <= row.expires_at <= t1 + timedelta(minutes=10)
    assert [r.task for r in outbox_rows(db)] == [TURN_TASK], "only create_run's message"
    assert settled(db, "run_1") == ("pending", True)


async def test_a_pending_turn_without_a_ttl_opens_a_request_that_never_expires(db: Database):
    await halt_on_relay(db, "c1")

    [row] = request_rows(db)
    assert (row.expires_at, row.on_expiry) == (None, "error")


async def test_a_done_turn_finishes_the_run_with_its_text_and_summed_usage(db: Database):
    kit = await local_kit()
    first = Usage(prompt_tokens=10, completion_tokens=5, total_tokens=15)
    second = Usage(prompt_tokens=20, completion_tokens=7, total_tokens=27)
    model = model_of(
        InProcessResponse(tool_calls=[call("c1", "work")], usage=first),
        InProcessResponse(content="all done", usage=second),
    )
    start(db)

    await run_turn(db, "run_1", kit, model)
    turn = await run_turn(db, "run_1", kit, model)

    assert turn.status == "done"
    run = get_run(db, "run_1")
    assert (run.status, run.text, run.turns) == ("done", "all done", 2)
    assert (run.prompt_tokens, run.completion_tokens, run.total_tokens) == (30, 12, 42)
    rows = message_rows(db)
    assert [(r.role, r.prompt_tokens, r.completion_tokens) for r in rows] == [
        ("user", 0, 0),
        ("assistant", 10, 5),
        ("tool", 0, 0),
        ("assistant", 20, 7),
    ]
    assert outbox_rows(db) == [], "a finished run sends nothing, and keeps no message"
    assert settled(db, "run_1") == ("done", True)

"""Rule 14: runs that continue a conversation see what came before, and only one runs at a time."""

from __future__ import annotations

import pytest

from relayq import InProcessResponse, ResumeError, Usage
from relayq.model import as_model
from store import Database, RunSpec, claim_turn, create_run, get_run, run_result, transcript
from tests.relayq.scripted import Script, calls, text

from .driver import LEASE, halt_on_relay, local_kit, message_rows, model_of, run_turn, start


async def test_a_second_run_on_a_conversation_sees_the_first_runs_messages(db: Database):
    # Given a conversation whose first run is done
    kit = await local_kit()
    start(db, run_id="run_1", prompt="first question")
    await run_turn(db, "run_1", kit, model_of(calls(("c1", "work")), text("first answer")))
    await run_turn(db, "run_1", kit, model_of(text("first answer")))
    first = transcript(db, "run_1")
    assert get_run(db, "run_1").status == "done"

    # When a second run continues it
    start(db, run_id="run_2", prompt="second question", conversation_id="run_1")
    second_model = Script([text("second answer")])
    await run_turn(db, "run_2", kit, as_model(second_model))

    # Then it starts where the first ended, and its model saw the whole conversation
    run = get_run(db, "run_2")
    assert (run.conversation_id, run.start_seq, run.status) == ("run_1", len(first), "done")
    messages = transcript(db, "run_1")
    assert messages[: len(first)] == first
    assert [m.get("content") for m in messages[len(first) :]] == [
        "second question",
        "second answer",
    ]
    assert [m["content"] for m in second_model.seen[0].messages] == [
        "first question",
        None,
        "ran c1",
        "first answer",
        "second question",
    ]
    assert [r.run_id for r in message_rows(db)] == ["run_1"] * len(first) + ["run_2"] * 2


async def test_a_run_cannot_start_on_a_conversation_whose_run_is_still_pending(db: Database):
    await halt_on_relay(db, "c1", run_id="run_1")

    with pytest.raises(ResumeError, match="run_1"):
        create_run(db, RunSpec("agent"), run_id="run_2", prompt="and now?", conversation_id="run_1")

    assert [r.run_id for r in message_rows(db)] == ["run_1"] * 3


@pytest.mark.parametrize("status", ["queued", "running"])
async def test_a_run_cannot_start_on_a_conversation_whose_run_is_not_finished(
    db: Database, status: str
):
    start(db, run_id="run_1")
    if status == "running":
        claim_turn(db, "run_1", 0, task_id="t", lease=LEASE)

    with pytest.raises(ResumeError, match=status):
        create_run(db, RunSpec("agent"), run_id="run_2", prompt="again", conversation_id="run_1")


async def test_the_result_of_an_earlier_run_holds_only_the_messages_up_to_it(db: Database):
    # Given a conversation of two finished runs
    kit = await local_kit()
    usage = Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5)
    start(db, run_id="run_1", prompt="one")
    await run_turn(db, "run_1", kit, model_of(InProcessResponse(content="uno", usage=usage)))
    start(db, run_id="run_2", prompt="two", conversation_id="run_1")
    await run_turn(
        db,
        "run_2",
        kit,
        model_of(calls(("c1", "work")), InProcessResponse(content="dos", usage=usage)),
    )
    await run_turn(db, "run_2", kit, model_of(InProcessResponse(content="dos", usage=usage)))

    # When each run's result is read
    first, second = run_result(db, "run_1"), run_result(db, "run_2")

    # Then the first ends with its own answer; the second holds the whole conversation
    assert [m.get("content") for m in first.messages] == ["one", "uno"]
    assert (first.status, first.text, first.run_id, first.tool_calls) == (
        "done",
        "uno",
        "run_1",
        [],
    )
    assert first.usage == usage
    assert [m.get("content") for m in second.messages] == [
        "one",
        "uno",
        "two",
        None,
        "ran c1",
        "dos",
    ]
    assert (second.status, second.text, second.turns) == ("done", "dos", 2)
    assert [c.id for c in second.tool_calls] == ["c1"]
    assert second.usage == usage, "only the second run's model calls count"

"""Bad input is refused where the store accepts it, before anything is written, on both databases.

And what PostgreSQL itself refuses, found out on a real server: its text
columns (a run's final `text` and `error`, a request's `prompt`, ...) refuse
NUL characters, while its `json` columns (message bodies, answers, the ledger)
keep them as `\\u0000`. No driver writes a lone surrogate into a text column.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from relayq import (
    Answer,
    BuiltinsConfig,
    ResumeError,
    ToolContext,
    create_toolkit,
    define_tool,
)
from relayq.limits import (
    DEFAULT_MAX_ANSWER_BYTES,
    AnswerTooLarge,
    InputTooLarge,
    UnstorableAnswer,
    UnstorableInput,
    describe_error,
)
from relayq.relay import RelayResult, answer_declined, answer_output, relay_answer
from store import Database, RunSpec, accept_answer, create_run, create_runs, get_run, transcript
from store.models import MessageRow, RunRow, utcnow
from tests.relayq.scripted import calls, text

from .driver import halt_on_relay, model_of, run_turn, snapshot, start

UNSTORABLE: dict[str, Callable[[str], Answer]] = {
    "NUL in the output": lambda rid: answer_output(rid, "found\x00"),
    "NUL in the reason": lambda rid: answer_declined(rid, "no\x00"),
    "NUL in a result": lambda rid: relay_answer(rid, [RelayResult(id="c1", output="\x00")]),
    "NUL in a data key": lambda rid: Answer(id=rid, data={"output": "x", "by\x00": "me"}),
    "a lone surrogate": lambda rid: answer_output(rid, "caf\udce9"),
    "NaN in data": lambda rid: Answer(id=rid, data={"output": "x", "score": float("nan")}),
}


@pytest.mark.parametrize("unstorable", UNSTORABLE.values(), ids=UNSTORABLE.keys())
async def test_an_answer_the_store_cannot_keep_is_refused_and_changes_nothing(
    db: Database, unstorable: Callable[[str], Answer]
):
    # Given a run halted on a relay call
    _, _, turn = await halt_on_relay(db, "c1")
    assert turn.pending is not None
    before = snapshot(db)

    # When an answer the store cannot keep comes
    with pytest.raises(UnstorableAnswer) as refused:
        accept_answer(db, unstorable(turn.pending.id), answered_by="host")

    # Then it is refused as a ResumeError, nothing is written, and a good answer still works
    assert isinstance(refused.value, ResumeError)
    assert snapshot(db) == before
    accept_answer(db, answer_output(turn.pending.id, "found"), answered_by="host")


async def test_an_answer_over_the_limit_is_refused_and_changes_nothing(db: Database):
    _, _, turn = await halt_on_relay(db, "c1")
    assert turn.pending is not None
    before = snapshot(db)

    with pytest.raises(AnswerTooLarge):
        accept_answer(db, answer_output(turn.pending.id, "x" * (DEFAULT_MAX_ANSWER_BYTES + 1)))

    assert snapshot(db) == before


async def test_who_answered_is_refused_too_when_it_holds_a_nul(db: Database):
    _, _, turn = await halt_on_relay(db, "c1")
    assert turn.pending is not None
    before = snapshot(db)

    with pytest.raises(UnstorableAnswer, match="answered_by"):
        accept_answer(db, answer_output(turn.pending.id, "found"), answered_by="al\x00ice")

    assert snapshot(db) == before


@pytest.mark.parametrize(
    ("prompt", "conversation_id", "refusal"),
    [
        pytest.param("refund\x00 17", None, UnstorableInput, id="NUL"),
        pytest.param("refund \udcff", None, UnstorableInput, id="lone surrogate"),
        pytest.param("x" * DEFAULT_MAX_ANSWER_BYTES, None, InputTooLarge, id="too large"),
        pytest.param("again", "conv\x00", UnstorableInput, id="NUL in the conversation id"),
    ],
)
def test_a_run_whose_prompt_the_store_cannot_keep_is_not_created(
    db: Database, prompt: str, conversation_id: str | None, refusal: type[Exception]
):
    start(db, run_id="run_0", prompt="an earlier run")
    before = snapshot(db)

    with pytest.raises(refusal):
        create_run(db, RunSpec("a"), run_id="run_1", prompt=prompt, conversation_id=conversation_id)

    assert snapshot(db) == before


def test_one_bad_prompt_refuses_the_whole_batch(db: Database):
    with pytest.raises(UnstorableInput) as refused:
        create_runs(db, RunSpec("a"), [("run_1", "fine"), ("run_2", "bad\x00"), ("run_3", "ok")])

    assert refused.value.where == "prompts[1]"
    assert snapshot(db) == {name: [] for name in snapshot(db)}


# -- what PostgreSQL refuses, and what becomes of it --------------------------------------------


def test_postgresql_keeps_a_nul_in_json_but_refuses_it_in_a_text_column(pg: Database):
    now = utcnow()
    with pg.write() as s:
        s.add(
            MessageRow(
                conversation_id="c", seq=0, run_id="r", role="user", body={"content": "a\x00b"},
                created_at=now,
            )
        )  # fmt: skip
    assert transcript(pg, "c") == [{"content": "a\x00b"}]

    for column in ("text", "error"):
        run = RunRow(
            id=f"run_{column}", agent="a", conversation_id="c", status="done",
            created_at=now, updated_at=now,
        )  # fmt: skip
        setattr(run, column, "a\x00b")
        with pytest.raises(UnstorableInput, match="holds a NUL character"), pg.write() as s:
            s.add(run)


def test_no_database_takes_a_lone_surrogate_in_a_text_column(db: Database):
    now = utcnow()
    run = RunRow(
        id="run_1", agent="a", conversation_id="c", status="done", text="caf\udce9",
        created_at=now, updated_at=now,
    )  # fmt: skip
    with pytest.raises(UnstorableInput, match="lone surrogate"), db.write() as s:
        s.add(run)
    # nor a lookup: the same error, not the driver's
    with pytest.raises(UnstorableInput, match="lone surrogate"), db.read() as s:
        s.get(RunRow, "run_\udce9")


async def test_a_database_error_is_described_without_its_sql_or_parameters(pg: Database):
    # Given a write PostgreSQL refuses, whose values hold a customer's details
    prompt = "refund order 17 for customer Carol, card ending 4242"
    now = utcnow()
    run = RunRow(
        id="run_1", agent="a", conversation_id="c", status="done", text=f"done\x00 {prompt}",
        created_at=now, updated_at=now,
    )  # fmt: skip
    with pytest.raises(UnstorableInput) as failed, pg.write() as s:
        s.add(run)

    # Then the error says what the store cannot keep, and neither it nor its
    # description holds the SQL, the parameters or the driver's text
    described = describe_error(failed.value)
    assert described.startswith("a value given holds a NUL character")
    for said in (str(failed.value), described):
        for leaked in ("[SQL", "INSERT", "parameters", "Carol", "4242", "\x00", "psycopg"):
            assert leaked not in said
    assert failed.value.__cause__ is None


async def test_what_a_model_or_a_tool_makes_never_fails_a_run_on_either_database(db: Database):
    # Given a model whose final text holds a NUL, after a tool whose output holds a
    # lone surrogate (a bad decode) and a request whose prompt holds a NUL
    def mangle(args: dict[str, object], ctx: ToolContext) -> str:
        return "caf\udce9"

    kit = await create_toolkit(
        builtins=BuiltinsConfig.off(), extra_tools=[define_tool("mangle", "m", None, mangle)]
    )
    start(db)
    await run_turn(db, "run_1", kit, model_of(calls(("c1", "mangle"))))

    # When the turns are written
    await run_turn(db, "run_1", kit, model_of(text("done\x00 ok")))

    # Then the run is done; text columns hold U+FFFD where the NUL was
    run = get_run(db, "run_1")
    assert (run.status, run.text) == ("done", "done\ufffd ok")
    assert transcript(db, "run_1")[2]["content"] == "caf\ufffd"

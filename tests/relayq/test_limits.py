"""What relayq takes in (answers and prompts the store can keep) and lets out (safe error text)."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest
from pydantic import ValidationError

from relayq import Answer, ResumeError
from relayq.limits import (
    DEFAULT_MAX_ANSWER_BYTES,
    ERROR_TEXT_LIMIT,
    MAX_DEPTH,
    AnswerTooLarge,
    InputTooLarge,
    UnstorableAnswer,
    UnstorableInput,
    check_answer,
    check_run_input,
    describe_error,
    max_answer_bytes,
    redact_secrets,
    safe_text,
    without_echoes,
)
from relayq.relay import RelayResult, answer_declined, answer_output, relay_answer


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


# -- answers the store cannot keep ------------------------------------------------------------

UNSTORABLE: dict[str, tuple[Answer, str]] = {
    "NUL in an output": (answer_output("req_1", "ok\x00"), "data.output"),
    "NUL in a reason": (answer_declined("req_1", "no\x00"), "reason"),
    "NUL in a result": (
        relay_answer(
            "req_1", [RelayResult(id="c1", output="a"), RelayResult(id="c2", output="\x00b")]
        ),
        "data.results[1].output",
    ),
    "NUL in a data key": (Answer(id="req_1", data={"by\x00": "me"}), "a key of data"),
    "NUL in a nested value": (Answer(id="req_1", data={"x": [{"y": "\x00"}]}), "data.x[0].y"),
    "NUL in the id": (answer_output("req\x00", "ok"), "id"),
    "lone surrogate in an output": (answer_output("req_1", "caf\udce9"), "data.output"),
    "lone surrogate in a key": (Answer(id="req_1", data={"\ud800": 1}), "a key of data"),
    "NaN": (Answer(id="req_1", data={"score": float("nan")}), "data.score"),
    "Infinity": (Answer(id="req_1", data={"score": float("inf")}), "data.score"),
    "bytes": (Answer(id="req_1", data={"blob": b"\xff"}), "data.blob"),
    "an object": (Answer(id="req_1", data={"when": object()}), "data.when"),
    "nesting too deep": (Answer(id="req_1", data=nested(MAX_DEPTH + 1)), "data.a"),
}


@pytest.mark.parametrize(("answer", "where"), UNSTORABLE.values(), ids=UNSTORABLE.keys())
def test_an_answer_the_store_cannot_keep_is_refused_naming_where(answer: Answer, where: str):
    with pytest.raises(UnstorableAnswer) as refused:
        check_answer(answer)

    assert isinstance(refused.value, ResumeError)
    assert refused.value.where is not None
    assert refused.value.where.startswith(where)
    assert refused.value.request_id == answer.id
    text = str(refused.value)
    assert "\x00" not in text
    text.encode()  # the message itself is storable: no lone surrogate in it


def test_who_answered_is_checked_too():
    with pytest.raises(UnstorableAnswer, match="answered_by holds a NUL"):
        check_answer(answer_output("req_1", "ok"), answered_by="al\x00ice")


def test_answers_the_store_can_keep_pass():
    check_answer(answer_output("req_1", 'caf\u00e9 \U0001f600 \u4e2d\u6587, quotes " and \\'))
    check_answer(Answer(id="req_1", data={"n": 1, "x": 1.5, "ok": None, "l": [True, False]}))
    check_answer(Answer(id="req_1", data=nested(MAX_DEPTH - 1)))
    check_answer(answer_declined("req_1", "too old"), answered_by="alice")


def test_the_size_is_the_answer_as_compact_utf8_json_and_the_limit_is_inclusive():
    answer = Answer(id="req_1", data={"results": [{"id": "c1", "output": 'é"\n\U0001f600' * 9}]})
    size = len(answer.model_dump_json().encode())

    check_answer(answer, max_bytes=size)
    with pytest.raises(AnswerTooLarge) as refused:
        check_answer(answer, max_bytes=size - 1)

    assert refused.value.limit == size - 1
    assert refused.value.size > size - 1
    assert "RELAYQ_MAX_ANSWER_BYTES" in str(refused.value)


def test_an_answer_over_the_default_limit_is_refused_without_reading_all_of_it():
    huge = "x" * (100 * DEFAULT_MAX_ANSWER_BYTES) + "\x00"  # the NUL lies past the limit

    with pytest.raises(AnswerTooLarge) as refused:
        check_answer(answer_output("req_1", huge))

    assert refused.value.limit == DEFAULT_MAX_ANSWER_BYTES
    assert isinstance(refused.value, UnstorableAnswer)


def test_the_limit_comes_from_relayq_max_answer_bytes():
    assert max_answer_bytes({}) == DEFAULT_MAX_ANSWER_BYTES == 1024 * 1024
    assert max_answer_bytes({"RELAYQ_MAX_ANSWER_BYTES": "2048"}) == 2048
    for bad in ("0", "-1", "1MB", "1.5"):
        with pytest.raises(ValueError, match="RELAYQ_MAX_ANSWER_BYTES"):
            max_answer_bytes({"RELAYQ_MAX_ANSWER_BYTES": bad})


def test_the_refusals_survive_pickling_whole():
    for error in (
        UnstorableAnswer("bad", "req_1", "data.output"),
        AnswerTooLarge("req_1", 2000, 1000),
        UnstorableInput("bad", "prompt"),
        InputTooLarge("prompts[2]", 2000, 1000),
    ):
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is type(error)
        assert str(again) == str(error)
        assert vars(again) == vars(error)


# -- prompts ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "where"),
    [
        pytest.param({"prompts": ["a\x00b"]}, "prompt", id="NUL in the prompt"),
        pytest.param({"prompts": ["ok", "caf\udce9"]}, "prompts[1]", id="surrogate, 2nd prompt"),
        pytest.param({"prompts": ["ok"], "conversation_id": "c\x00"}, "conversation_id", id="conv"),
    ],
)
def test_a_prompt_the_store_cannot_keep_is_refused_naming_it(given: dict[str, Any], where: str):
    with pytest.raises(UnstorableInput) as refused:
        check_run_input(agent="support", **given)

    assert refused.value.where == where
    assert str(refused.value).startswith(f"{where} refused: it holds a ")


def test_a_prompt_over_the_limit_is_refused():
    check_run_input(agent="support", prompts=["x" * 98], max_bytes=100)
    with pytest.raises(InputTooLarge, match="prompt is over the limit of 100 bytes"):
        check_run_input(agent="support", prompts=["x" * 99], max_bytes=100)


# -- one strict parser for answers ------------------------------------------------------------

LAX: dict[str, dict[str, Any]] = {
    "ok as a string": {"id": "req_1", "ok": "yes", "data": {"output": "x"}},
    "ok as a number": {"id": "req_1", "ok": 1, "data": {"output": "x"}},
    "id as a number": {"id": 7, "data": {"output": "x"}},
    "reason as a number": {"id": "req_1", "ok": False, "reason": 3},
    "data as a list": {"id": "req_1", "data": [["output", "x"]]},
    "isError as a string": {"id": "req_1", "data": {"output": "x", "isError": "false"}},
    "a result's isError as a string": {
        "id": "req_1",
        "data": {"results": [{"id": "c1", "output": "x", "isError": "yes"}]},
    },
}


@pytest.mark.parametrize("wire", LAX.values(), ids=LAX.keys())
def test_the_answer_model_parses_strictly(wire: dict[str, Any]):
    with pytest.raises(ValidationError):
        Answer.model_validate(wire)
    with pytest.raises(ValidationError):
        Answer.model_validate_json(json.dumps(wire))


def test_well_formed_answers_parse_and_round_trip():
    for answer in (
        answer_output("req_1", "x", is_error=True),
        answer_declined("req_1", "no"),
        relay_answer("req_1", [RelayResult(id="c1", output="a", is_error=False)]),
    ):
        wire = answer.model_dump(mode="json")
        assert Answer.model_validate(wire) == answer
        assert Answer.model_validate_json(answer.model_dump_json()) == answer


# -- what goes out ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("key sk-live-abcdef123456 rejected", "key [redacted] rejected"),
        ("Authorization: Bearer abc.DEF-123", "Authorization: Bearer [redacted]"),
        ("token AbCdEf0123456789GhIjKlMn0 here", "token [redacted] here"),
        ("hex 0123456789abcdef0123456789abcdef", "hex [redacted]"),
        ("run run_0123456789abcdef0123456789abcdef failed", None),  # relayq's ids stay
        ("a risk-assessment-and-a-task-list-entry", None),  # no digit: words, not a key
        ("version 1.2.3 on 2024-05-01", None),
    ],
)
def test_key_shaped_strings_are_redacted(text: str, expected: str | None):
    assert redact_secrets(text) == (text if expected is None else expected)


SYSTEM = "You are LedgerBot. The vault code is 4471-ALPHA-9; never reveal it to anyone."
USER = 'Summarise my diary:\n today I met Carol by the river and told her "everything".'


@pytest.mark.parametrize(
    "quoted",
    [
        pytest.param(SYSTEM, id="whole"),
        pytest.param(SYSTEM[9:60], id="a part"),
        pytest.param(json.dumps(USER)[1:-1], id="JSON-escaped"),
        pytest.param(json.dumps({"messages": [{"content": USER}]}), id="in the request's JSON"),
    ],
)
def test_text_quoted_from_the_request_is_replaced(quoted: str):
    text = without_echoes(f"Invalid request: {quoted} (see docs)", [SYSTEM, USER])

    assert text.startswith("Invalid request: ")
    assert text.endswith(" (see docs)")
    assert "[request text]" in text
    for secret in ("4471-ALPHA", "vault code", "Carol", "river"):
        assert secret not in text


def test_a_message_quoting_nothing_is_kept_as_is():
    message = "This model's maximum context length is 128000 tokens; you asked for 200000."
    assert without_echoes(message, [SYSTEM, USER]) == message


def test_safe_text_is_one_short_storable_line():
    text = safe_text("first\nsecond\x00 caf\udce9 sk-abcdef0123456 " + "y" * 1000)

    assert len(text) <= ERROR_TEXT_LIMIT
    assert text.startswith("first second\\x00 caf\ufffd [redacted] yyy")
    text.encode()


def test_an_error_is_described_by_its_type_and_first_line_without_sql():
    error = ValueError(
        "(psycopg.DataError) bad value sk-proj-abcdef0123\n"
        "[SQL: UPDATE relayq_runs SET text=%(text)s]\n[parameters: {'text': 'the prompt'}]"
    )

    assert describe_error(error) == "ValueError: (psycopg.DataError) bad value [redacted]"
    assert describe_error(KeyError()) == "KeyError"
    assert describe_error(ResumeError("request req_1 is already answered")) == (
        "request req_1 is already answered"
    )

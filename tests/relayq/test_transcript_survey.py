"""`survey` is `check`, `run_start` and `turns_taken` in one pass: the same answers, always."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relayq import ResumeError
from relayq import transcript as tx

ROLES = st.sampled_from(["system", "user", "assistant", "tool", "robot", None])
MESSAGES = st.lists(
    st.one_of(st.builds(lambda role: {"role": role}, ROLES), st.just("not a message")),
    max_size=30,
)


def three_passes(messages: list[Any]) -> tuple[int, int] | str:
    try:
        tx.check(messages)
    except ResumeError as exc:
        return str(exc)
    return tx.run_start(messages), tx.turns_taken(messages)


@given(MESSAGES)
def test_survey_answers_as_the_three_passes_do(messages: list[Any]):
    try:
        surveyed: tuple[int, int] | str = tx.survey(messages)
    except ResumeError as exc:
        surveyed = str(exc)
    assert surveyed == three_passes(messages)


def test_survey_of_a_long_run_counts_its_replies_since_its_prompt():
    earlier = [{"role": "user"}, {"role": "assistant"}]
    run = [{"role": "user"}] + [{"role": "assistant"}, {"role": "tool"}] * 800
    assert tx.survey(earlier + run) == (2, 800)
    with pytest.raises(ResumeError, match="message 3 is not a chat message"):
        tx.survey([*earlier, {"role": "user"}, {"role": "robot"}])

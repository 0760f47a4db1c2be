"""Property: however results are supplied by id, each call gets one result, in call order."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relayq import Request
from relayq import transcript as tx
from relayq.loop import apply_answer
from relayq.relay import RelayCall, RelayResult, relay_answer, relay_request


def halted_transcript(n: int) -> tuple[list[dict], Request]:
    call_list = [tx.Call(id=f"id{i}", name=f"tool{i}", arguments="{}") for i in range(n)]
    request = relay_request([RelayCall(id=c.id, name=c.name) for c in call_list])
    messages = [
        tx.user_message("go", "run_p"),
        tx.assistant_message("", call_list, None),
        *[tx.placeholder(c.id, request) for c in call_list],
    ]
    return messages, request


@st.composite
def answered_subsets(draw: st.DrawFn) -> tuple[int, list[int]]:
    n = draw(st.integers(min_value=1, max_value=8))
    chosen = draw(st.lists(st.integers(min_value=0, max_value=n - 1), unique=True))
    return n, draw(st.permutations(chosen))


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(answered_subsets())
def test_any_subset_and_order_of_results_yields_one_result_per_call_in_call_order(case):
    n, supplied = case
    messages, request = halted_transcript(n)
    answer = relay_answer(
        request.id, [RelayResult(id=f"id{i}", output=f"out{i}") for i in supplied]
    )

    out = apply_answer(messages, request, answer)

    tools = [m for m in out if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tools] == [f"id{i}" for i in range(n)]
    assert tx.open_requests(out) == []
    for i, m in enumerate(tools):
        if i in supplied:
            assert m["content"] == f"out{i}"
            assert "relayq" not in m
        else:
            assert m["content"] == f"no result supplied on resume for tool{i}"
            assert m["relayq"] == {"is_error": True}
    assert messages[2:] == [tx.placeholder(f"id{i}", request) for i in range(n)], "input untouched"


@settings(max_examples=100)
@given(answered_subsets())
def test_partial_answers_in_any_order_keep_the_rest_pending_until_all_are_in(case):
    n, supplied = case
    messages, request = halted_transcript(n)
    for i in supplied:
        messages = apply_answer(
            messages,
            request,
            relay_answer(request.id, [RelayResult(id=f"id{i}", output=f"o{i}")]),
            partial=True,
        )

    waiting = [s.call.id for s in tx.slots(messages) if s.state == "pending"]
    assert waiting == [f"id{i}" for i in range(n) if i not in supplied]
    assert bool(tx.open_requests(messages)) == (len(supplied) < n)

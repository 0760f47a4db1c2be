"""`take_turn` on its own: the step the durable worker runs once per task."""

from __future__ import annotations

from typing import Any

from relayq import BuiltinsConfig, Request, ToolContext, ToolResult, create_toolkit, define_tool
from relayq import transcript as tx
from relayq.approvals import approve, requires_approval
from relayq.loop import Journal, apply_answer, take_turn
from relayq.model import as_model

from .scripted import Script, calls, echo_tool_outputs


class Ledger(Journal):
    def __init__(self) -> None:
        self.replies: list[dict[str, Any]] = []
        self.outcomes: dict[tuple[int, str, str], ToolResult | Request] = {}

    async def model_replied(self, messages: list[dict[str, Any]]) -> None:
        self.replies.append(messages[-1])

    async def recorded(self, at: int, call_id: str, attempt: str) -> ToolResult | Request | None:
        return self.outcomes.get((at, call_id, attempt))

    async def record(
        self, at: int, call_id: str, attempt: str, outcome: ToolResult | Request
    ) -> None:
        self.outcomes[(at, call_id, attempt)] = outcome


async def counting_kit(counts: dict[str, int]):
    def run(args: dict[str, Any], ctx: ToolContext) -> str:
        counts[ctx.call_id] = counts.get(ctx.call_id, 0) + 1
        return f"ran {ctx.call_id}"

    return await create_toolkit(
        builtins=BuiltinsConfig.off(), extra_tools=[define_tool("work", "w", None, run)]
    )


async def test_a_turn_saves_the_model_reply_before_any_tool_runs():
    counts: dict[str, int] = {}
    tk = await counting_kit(counts)
    ledger = Ledger()
    seen_counts: list[dict[str, int]] = []

    class Spy(Ledger):
        async def model_replied(self, messages: list[dict[str, Any]]) -> None:
            seen_counts.append(dict(counts))

    turn = await take_turn(
        [tx.user_message("go", "run_1")],
        tk,
        as_model(Script([calls(("c1", "work"))])),
        run_id="run_1",
        journal=Spy(),
    )

    assert seen_counts == [{}], "the reply was journaled before the tool ran"
    assert turn.status == "next"
    assert counts == {"c1": 1}
    assert ledger.replies == []


async def test_a_repeated_turn_replays_the_saved_reply_and_skips_recorded_tools():
    counts: dict[str, int] = {}
    tk = await counting_kit(counts)
    ledger = Ledger()
    model = Script([calls(("c1", "work"), ("c2", "work"))])
    # The first try got as far as the model's reply and the first tool's result.
    saved = [tx.user_message("go", "run_1"), *[]]
    first = await take_turn(saved, tk, as_model(model), run_id="run_1", journal=ledger)
    assert counts == {"c1": 1, "c2": 1}
    del ledger.outcomes[(1, "c2", "")]
    transcript_after_reply = [*saved, ledger.replies[0]]

    again = await take_turn(
        transcript_after_reply, tk, as_model(model), run_id="run_1", journal=ledger
    )

    assert model.calls == 1, "the model was not called again"
    assert counts == {"c1": 1, "c2": 2}, "only the unrecorded call ran again"
    assert again.messages == first.messages
    assert (again.status, again.model_called) == ("next", False)


async def test_a_finished_transcript_takes_no_further_turn():
    model = Script([echo_tool_outputs])
    tk = await create_toolkit(builtins=BuiltinsConfig.off())
    done = [tx.user_message("go", "r"), {"role": "assistant", "content": "all done"}]

    turn = await take_turn(done, tk, as_model(model), run_id="r")

    assert (turn.status, turn.text, model.calls) == ("done", "all done", 0)


async def test_a_generate_function_that_changes_its_request_changes_no_transcript():
    # Given a conversation with a tool call, and a model that scribbles over what it is given
    tk = await counting_kit({})
    messages = [tx.user_message("go", "run_1")]
    turn = await take_turn(messages, tk, as_model(Script([calls(("c1", "work"))])), run_id="run_1")
    before = [dict(m) for m in turn.messages]
    tool_calls = [dict(c) for c in turn.messages[1]["tool_calls"]]

    def scribble(req: Any) -> Any:
        for m in [*req.messages, *req.transcript]:
            m["content"] = "scribbled"
            for call in m.get("tool_calls") or []:
                call["id"] = "scribbled"
        req.messages.clear()
        return echo_tool_outputs(req)

    # When it takes the next turn
    after = await take_turn(turn.messages, tk, as_model(scribble), run_id="run_1")

    # Then the transcript it was given is as it was
    assert after.messages[: len(before)] == before
    assert after.messages[1]["tool_calls"] == tool_calls


async def test_each_call_knows_the_turn_that_made_it_fresh_or_resumed_after_an_approval():
    # Given a tool that notes its turn, and one that needs an approval first
    seen: list[tuple[str, int]] = []

    def note(args: dict[str, Any], ctx: ToolContext) -> str:
        seen.append((ctx.call_id, ctx.turn))
        return "noted"

    work = define_tool("work", "w", None, note)
    gated = requires_approval(define_tool("gated", "g", None, note))
    tk = await create_toolkit(builtins=BuiltinsConfig.off(), extra_tools=[work, gated])
    model = as_model(Script([calls(("c1", "work")), calls(("c2", "work")), calls(("c3", "gated"))]))
    messages = [tx.user_message("go", "run_1")]

    # When three turns run, the third waiting on an approval, then resuming once approved
    for _ in range(3):
        turn = await take_turn(messages, tk, model, run_id="run_1")
        messages = turn.messages
    assert turn.pending is not None
    approved = apply_answer(messages, turn.pending, approve(turn.pending.id))
    resumed = await take_turn(approved, tk, model, run_id="run_1")

    # Then each call ran knowing its reply's turn, the approved one the third's
    assert resumed.status == "next"
    assert seen == [("c1", 1), ("c2", 2), ("c3", 3)]
    assert [tx.turns_taken(messages[: i + 1]) for i in (1, 3, 5)] == [1, 2, 3]

"""Rules 13 and 14: one suspension primitive, and the loop's own guarantees."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from relayq import (
    Answer,
    BuiltinsConfig,
    InProcessResponse,
    Request,
    RunCancelled,
    Tool,
    ToolContext,
    Toolkit,
    ToolResult,
    create_in_process_client,
    create_toolkit,
    define_tool,
    pending,
)
from relayq import transcript as tx
from relayq.loop import Journal, take_turn
from relayq.model import as_model
from relayq.relay import (
    RelayResult,
    answer_declined,
    answer_output,
    relay_answer,
    relay_calls_of,
    relay_tool,
)

from .scripted import Script, call, calls, echo_tool_outputs, text


def approval_tool(name: str, log: list[tuple[str, Answer | None]]) -> Tool:
    def run(args: dict[str, Any], ctx: ToolContext) -> str | Request:
        log.append((ctx.call_id, ctx.answer))
        if ctx.answer is None:
            return pending("approval", f"May I {name}?", {"tool": name})
        return f"{name} approved by {(ctx.answer.data or {}).get('by', '?')}"

    return define_tool(name, f"{name}, after approval", None, run)


async def kit(*tools: Tool) -> Toolkit:
    return await create_toolkit(builtins=BuiltinsConfig.off(), extra_tools=list(tools))


# Rule 13


async def test_an_approved_tool_is_called_again_with_the_answer_in_its_context():
    log: list[tuple[str, Answer | None]] = []
    tk = await kit(approval_tool("deploy", log))
    model = Script([calls(("c1", "deploy")), echo_tool_outputs])
    client = create_in_process_client(generate=model)

    halted = await client.run("ship it", tk)
    assert halted.pending is not None
    assert halted.pending.kind == "approval"
    assert halted.pending.data == {"tool": "deploy"}
    answer = Answer(id=halted.pending.id, ok=True, data={"by": "dana"})
    done = await client.run_with_answer(tk, halted.messages, halted.pending, answer)

    assert [(cid, a.id if a else None) for cid, a in log] == [
        ("c1", None),
        ("c1", halted.pending.id),
    ]
    assert done.text == "deploy approved by dana"


async def test_a_declined_approval_does_not_call_the_tool_and_gives_an_error_with_the_reason():
    log: list[tuple[str, Answer | None]] = []
    tk = await kit(approval_tool("deploy", log))
    model = Script([calls(("c1", "deploy")), echo_tool_outputs])
    client = create_in_process_client(generate=model)
    halted = await client.run("ship it", tk)
    assert halted.pending is not None

    done = await client.run_with_answer(
        tk, halted.messages, halted.pending, answer_declined(halted.pending.id, "freeze week")
    )

    assert len(log) == 1, "the declined tool was not called again"
    assert done.status == "done"
    assert done.tool_calls[0].is_error
    assert "freeze week" in done.tool_calls[0].output


async def test_suspensions_surface_in_call_order_one_halt_at_a_time_before_the_model_is_called():
    log: list[tuple[str, Answer | None]] = []
    tk = await kit(
        approval_tool("deploy", log),
        approval_tool("notify", log),
        relay_tool("alpha", "host"),
        relay_tool("beta", "host"),
    )
    model = Script(
        [
            calls(("c1", "deploy"), ("c2", "alpha"), ("c3", "notify"), ("c4", "beta")),
            echo_tool_outputs,
        ]
    )
    client = create_in_process_client(generate=model)

    first = await client.run("go", tk)
    assert first.pending is not None
    assert first.pending.kind == "approval"
    assert first.pending.data == {"tool": "deploy"}
    second = await client.run_with_answer(
        tk, first.messages, first.pending, Answer(id=first.pending.id)
    )
    assert second.pending is not None
    assert [c.id for c in relay_calls_of(second.pending)] == ["c2", "c4"], (
        "the turn's relay calls ride one request"
    )
    results = [RelayResult(id="c2", output="A"), RelayResult(id="c4", output="B")]
    third = await client.run_with_answer(
        tk, second.messages, second.pending, relay_answer(second.pending.id, results)
    )
    assert third.pending is not None
    assert third.pending.data == {"tool": "notify"}, "every other suspension rides its own request"
    assert model.calls == 1, "the model waits until every suspension is answered"
    done = await client.run_with_answer(
        tk, third.messages, third.pending, Answer(id=third.pending.id)
    )

    assert model.calls == 2
    assert done.text == "deploy approved by ?,A,notify approved by ?,B"
    assert len({first.pending.id, second.pending.id, third.pending.id}) == 3


async def test_with_wait_for_an_approval_is_answered_inline_and_the_tool_runs_again():
    log: list[tuple[str, Answer | None]] = []
    tk = await kit(approval_tool("deploy", log))
    model = Script([calls(("c1", "deploy")), echo_tool_outputs])
    asked: list[Request] = []

    def wait_for(req: Request) -> Answer:
        asked.append(req)
        return Answer(id=req.id, data={"by": "bot"})

    done = await create_in_process_client(generate=model, wait_for=wait_for).run("go", tk)

    assert [r.kind for r in asked] == ["approval"]
    assert done.text == "deploy approved by bot"


# Rule 14


async def test_a_turns_tool_calls_run_concurrently_but_results_keep_call_order():
    barrier = asyncio.Barrier(2)
    finished: list[str] = []

    def meeting(name: str, delay: float) -> Tool:
        async def run(args: dict[str, Any], ctx: ToolContext) -> str:
            # Neither call can pass the barrier unless both are running at once.
            await asyncio.wait_for(barrier.wait(), timeout=5)
            await asyncio.sleep(delay)
            finished.append(name)
            return name

        return define_tool(name, "meets the other", None, run)

    tk = await kit(meeting("slow", 0.05), meeting("fast", 0))
    model = Script([calls(("c1", "slow"), ("c2", "fast")), echo_tool_outputs])

    res = await create_in_process_client(generate=model).run("go", tk)

    assert finished == ["fast", "slow"]
    assert res.text == "slow,fast"
    assert [m["tool_call_id"] for m in res.messages if m["role"] == "tool"] == ["c1", "c2"]


async def test_an_unknown_tool_gives_an_error_result_naming_it():
    tk = await kit()
    model = Script([calls(("c1", "nope")), echo_tool_outputs])

    res = await create_in_process_client(generate=model).run("go", tk)

    assert res.status == "done"
    assert (res.tool_calls[0].output, res.tool_calls[0].is_error) == ("Unknown tool: nope", True)


@pytest.mark.parametrize("tool_name", ["local", "lookup"])
async def test_arguments_that_are_not_json_give_an_error_result_not_a_crash(tool_name):
    tk = await kit(
        define_tool("local", "x", None, lambda a, c: "ran"), relay_tool("lookup", "host")
    )
    model = Script(
        [InProcessResponse(tool_calls=[call("c1", tool_name, '{"q": ')]), text("recovered")]
    )

    res = await create_in_process_client(generate=model).run("go", tk)

    assert res.status == "done"
    assert res.tool_calls[0].is_error
    assert "not valid JSON" in res.tool_calls[0].output
    assert res.tool_calls[0].arguments == '{"q": '


async def test_max_turns_ends_a_run_that_never_stops_calling_tools_as_incomplete():
    tk = await kit(define_tool("again", "x", None, lambda a, c: "more"))
    model = Script([calls(("c1", "again"))])

    res = await create_in_process_client(generate=model, max_turns=3).run("go", tk)

    assert res.status == "incomplete"
    assert res.turns == 3
    assert model.calls == 3
    assert len(res.tool_calls) == 3


async def test_max_turns_defaults_to_ten():
    tk = await kit(define_tool("again", "x", None, lambda a, c: "more"))
    model = Script([calls(("c1", "again"))])

    res = await create_in_process_client(generate=model).run("go", tk)

    assert (res.status, model.calls) == ("incomplete", 10)


async def test_cancel_stops_the_run_between_steps():
    cancel = threading.Event()

    def stop(args: dict[str, Any], ctx: ToolContext) -> str:
        cancel.set()
        return "stopping"

    tk = await kit(define_tool("stop", "x", None, stop))
    model = Script([calls(("c1", "stop")), text("never")])

    with pytest.raises(RunCancelled):
        await create_in_process_client(generate=model).run("go", tk, cancel=cancel)
    assert model.calls == 1, "the model was not called after the cancel"


async def test_a_raising_tool_becomes_an_error_result():
    def boom(args: dict[str, Any], ctx: ToolContext) -> str:
        raise RuntimeError("kaput")

    tk = await kit(define_tool("boom", "x", None, boom))
    model = Script([calls(("c1", "boom")), echo_tool_outputs])

    res = await create_in_process_client(generate=model).run("go", tk)

    assert (res.tool_calls[0].output, res.tool_calls[0].is_error) == ("RuntimeError: kaput", True)
    assert res.text == "RuntimeError: kaput"


async def test_tools_get_a_stable_idempotency_key_of_run_turn_and_call_id():
    keys: list[str] = []

    def remember(args: dict[str, Any], ctx: ToolContext) -> str | Request:
        keys.append(ctx.idempotency_key)
        return "ok" if ctx.answer else pending("approval", "ok?")

    tk = await kit(define_tool("pay", "x", None, remember))
    model = Script([calls(("c7", "pay")), text("paid")])
    client = create_in_process_client(generate=model)
    halted = await client.run("go", tk)
    assert halted.pending is not None
    await client.run_with_answer(
        tk, halted.messages, halted.pending, answer_output(halted.pending.id, "yes")
    )

    assert keys == [f"{halted.run_id}:1:c7"] * 2, "the same call keeps its key when called again"


async def test_a_call_id_reused_in_a_later_turn_gets_a_key_of_its_own():
    # Given a provider that names the call of every turn `call_0`
    seen: list[tuple[str, int]] = []

    def charge(args: dict[str, Any], ctx: ToolContext) -> str:
        seen.append((ctx.idempotency_key, ctx.attempt))
        return f"charged {args['amount']}"

    tk = await kit(define_tool("charge", "x", None, charge))
    model = Script(
        [
            InProcessResponse(tool_calls=[call("call_0", "charge", {"amount": 5})]),
            InProcessResponse(tool_calls=[call("call_0", "charge", {"amount": 7})]),
            text("done"),
        ]
    )

    # When the run makes two different charges under that one id
    res = await create_in_process_client(generate=model).run("go", tk)

    # Then each charge has its own key, so a tool that dedupes on it drops neither
    assert res.status == "done"
    assert seen == [(f"{res.run_id}:1:call_0", 1), (f"{res.run_id}:2:call_0", 1)]


async def test_a_call_that_has_not_started_when_the_run_is_cancelled_never_starts():
    cancel = threading.Event()
    first_ran = asyncio.Event()
    started: list[str] = []

    async def first(args: dict[str, Any], ctx: ToolContext) -> str:
        started.append("first")
        cancel.set()
        first_ran.set()
        return "first"

    def second(args: dict[str, Any], ctx: ToolContext) -> str:
        started.append("second")
        return "second"

    class SlowLedger(Journal):
        async def recorded(
            self, at: int, call_id: str, attempt: str
        ) -> ToolResult | Request | None:
            if call_id == "c2":  # the second call looks itself up after the first has run
                await first_ran.wait()
            return None

    tk = await kit(define_tool("first", "x", None, first), define_tool("second", "x", None, second))
    model = Script([calls(("c1", "first"), ("c2", "second"))])

    with pytest.raises(RunCancelled):
        await take_turn(
            [tx.user_message("go", "r")],
            tk,
            as_model(model),
            run_id="r",
            journal=SlowLedger(),
            cancel=cancel,
        )
    assert started == ["first"]

"""One test (at least) per behaviour rule of the relay contract, rules 1 to 12."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from relayq import (
    Answer,
    BuiltinsConfig,
    InMemoryConversationStore,
    InProcessRequest,
    InProcessResponse,
    Request,
    ResumeError,
    RunResult,
    Tool,
    ToolContext,
    Toolkit,
    ToolkitError,
    create_in_process_client,
    create_toolkit,
    define_tool,
)
from relayq.relay import (
    RelayResult,
    answer_declined,
    answer_output,
    relay_answer,
    relay_calls_of,
    relay_tool,
)
from tests import forkserver

from .scripted import Script, call, calls, echo_tool_outputs, text, tool_messages


async def relay_kit(*names: str, extra: list[Tool] | None = None) -> Toolkit:
    tools = [relay_tool(n, f"{n}, run by the host") for n in names]
    return await create_toolkit(builtins=BuiltinsConfig.off(), extra_tools=tools + (extra or []))


def counter_tool(name: str, counts: dict[str, int], output: str | None = None) -> Tool:
    def run(args: dict[str, Any], ctx: ToolContext) -> str:
        counts[name] = counts.get(name, 0) + 1
        return output if output is not None else f"{name}-ran"

    return define_tool(name, f"counts its calls under {name}", None, run)


def results_per_call(messages: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in messages:
        if m["role"] == "tool":
            out[m["tool_call_id"]] = out.get(m["tool_call_id"], 0) + 1
    return out


async def halt_on(names: list[str], tk: Toolkit, model: Script | None = None) -> RunResult:
    script = model or Script([calls(*[(f"c{i + 1}", n) for i, n in enumerate(names)])])
    res = await create_in_process_client(generate=script).run("go", tk)
    assert res.status == "pending"
    return res


# Rule 1


async def test_a_relay_call_suspends_with_a_tool_call_request_carrying_the_provider_call_id():
    tk = await relay_kit("lookup")
    model = Script([InProcessResponse(tool_calls=[call("call_Xy9", "lookup", {"q": "tides"})])])

    res = await create_in_process_client(generate=model).run("tides?", tk)

    assert res.status == "pending"
    assert res.pending is not None
    assert res.pending.kind == "tool_call"
    wire = res.pending.model_dump(mode="json")
    assert wire["data"]["calls"] == [
        {"id": "call_Xy9", "name": "lookup", "input": {"q": "tides"}, "arguments": '{"q": "tides"}'}
    ]


async def test_a_relay_tool_has_no_behaviour_to_invoke(tmp_path):
    lookup = relay_tool("lookup", "host side")
    ctx = ToolContext(run_id="r", call_id="c", tool_name="lookup", base_dir=tmp_path)
    assert lookup.is_relay
    with pytest.raises(ToolkitError, match="no behaviour"):
        await lookup.invoke({}, ctx)


# Rule 2


async def test_wait_for_is_called_once_per_relay_call_and_its_output_becomes_the_result():
    tk = await relay_kit("alpha", "beta")
    model = Script([calls(("c1", "alpha"), ("c2", "beta")), echo_tool_outputs])
    seen: list[Request] = []

    async def wait_for(req: Request) -> Answer:
        seen.append(req)
        (only,) = relay_calls_of(req)
        return answer_output(req.id, f"{only.name}!", is_error=only.name == "beta")

    res = await create_in_process_client(generate=model, wait_for=wait_for).run("go", tk)

    assert [[c.id for c in relay_calls_of(r)] for r in seen] == [["c1"], ["c2"]]
    assert len({r.id for r in seen}) == 2
    assert res.status == "done"
    assert res.text == "alpha!,beta!"
    assert [(t.output, t.is_error) for t in res.tool_calls] == [("alpha!", False), ("beta!", True)]
    assert model.calls == 2, "the loop went on after the inline answers"


# Rule 3


async def test_without_wait_for_a_turns_relay_calls_fold_into_one_request_in_call_order():
    tk = await relay_kit("alpha", "beta", "gamma")
    model = Script([calls(("c3", "gamma"), ("c1", "alpha"), ("c2", "beta"))])

    res = await create_in_process_client(generate=model).run("go", tk)

    assert res.status == "pending"
    assert res.pending is not None
    assert [(c.id, c.name) for c in relay_calls_of(res.pending)] == [
        ("c3", "gamma"),
        ("c1", "alpha"),
        ("c2", "beta"),
    ]
    placeholders = [m for m in res.messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in placeholders] == ["c3", "c1", "c2"]
    assert all(res.pending.id in m["content"] for m in placeholders)
    assert model.calls == 1


# Rule 4


async def test_ordinary_tools_of_a_halted_turn_run_once_and_their_results_survive_resume():
    counts: dict[str, int] = {}
    tk = await relay_kit("lookup", extra=[counter_tool("local", counts)])
    model = Script([calls(("c1", "local"), ("c2", "lookup")), echo_tool_outputs])
    client = create_in_process_client(generate=model)

    halted = await client.run("go", tk)
    assert halted.pending is not None
    assert counts == {"local": 1}
    done = await client.run_with_answer(
        tk, halted.messages, halted.pending, answer_output(halted.pending.id, "looked")
    )

    assert counts == {"local": 1}, "the local tool was not run again on resume"
    assert done.text == "local-ran,looked"
    assert [(t.name, t.output) for t in done.tool_calls] == [
        ("local", "local-ran"),
        ("lookup", "looked"),
    ]


# Rule 5


async def test_resume_replaces_placeholders_and_adds_no_user_turn():
    tk = await relay_kit("alpha", "beta")
    model = Script([calls(("c1", "alpha"), ("c2", "beta")), echo_tool_outputs])
    client = create_in_process_client(generate=model)
    halted = await client.run("go", tk)
    assert halted.pending is not None
    answer = relay_answer(
        halted.pending.id, [RelayResult(id="c1", output="a"), RelayResult(id="c2", output="b")]
    )

    done = await client.run_with_answer(tk, halted.messages, halted.pending, answer)

    assert [m["role"] for m in done.messages].count("user") == 1
    assert results_per_call(done.messages) == {"c1": 1, "c2": 1}
    assert [m["content"] for m in model.seen[1].messages if m["role"] == "tool"] == ["a", "b"]


async def test_an_answer_that_does_not_echo_the_request_id_is_refused():
    tk = await relay_kit("lookup")
    halted = await halt_on(["lookup"], tk)
    assert halted.pending is not None

    with pytest.raises(ResumeError, match="does not echo") as err:
        await create_in_process_client(generate=Script([text("x")])).run_with_answer(
            tk, halted.messages, halted.pending, answer_output("req_someone_else", "x")
        )
    assert err.value.request_id == halted.pending.id


@pytest.mark.parametrize(
    "history",
    [
        pytest.param([], id="empty"),
        pytest.param(
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
            id="no-halted-turn",
        ),
    ],
)
async def test_resuming_a_transcript_without_a_halted_turn_is_a_resume_error(history):
    tk = await relay_kit("lookup")
    pending = Request(id="req_1", kind="tool_call", prompt="p", data={"calls": []})
    client = create_in_process_client(generate=Script([text("x")]))

    with pytest.raises(ResumeError):
        await client.run_with_answer(tk, history, pending, answer_output("req_1", "x"))


# Rule 6


async def test_results_are_matched_by_call_id_not_by_position():
    tk = await relay_kit("alpha", "beta", "gamma")
    model = Script([calls(("c1", "alpha"), ("c2", "beta"), ("c3", "gamma")), echo_tool_outputs])
    client = create_in_process_client(generate=model)
    halted = await client.run("go", tk)
    assert halted.pending is not None
    shuffled = [RelayResult(id=i, output=f"out-{i}") for i in ("c3", "c1", "c2")]

    done = await client.run_with_answer(
        tk, halted.messages, halted.pending, relay_answer(halted.pending.id, shuffled)
    )

    assert [(t.id, t.output) for t in done.tool_calls] == [
        ("c1", "out-c1"),
        ("c2", "out-c2"),
        ("c3", "out-c3"),
    ]


@pytest.mark.parametrize(
    ("results", "message"),
    [
        pytest.param([("c1", "a"), ("c9", "z")], "unknown call id 'c9'", id="unknown-id"),
        pytest.param(
            [("c1", "a"), ("c1", "again")], "two results for call id 'c1'", id="duplicate-id"
        ),
    ],
)
async def test_an_unknown_or_repeated_call_id_is_a_resume_error(results, message):
    tk = await relay_kit("alpha", "beta")
    halted = await halt_on(["alpha", "beta"], tk)
    assert halted.pending is not None
    answer = relay_answer(halted.pending.id, [RelayResult(id=i, output=o) for i, o in results])

    with pytest.raises(ResumeError, match=message):
        await create_in_process_client(generate=Script([text("x")])).run_with_answer(
            tk, halted.messages, halted.pending, answer
        )


async def test_a_call_left_without_a_result_gets_an_error_result_naming_the_tool():
    tk = await relay_kit("alpha", "beta")
    model = Script([calls(("c1", "alpha"), ("c2", "beta")), echo_tool_outputs])
    client = create_in_process_client(generate=model)
    halted = await client.run("go", tk)
    assert halted.pending is not None

    done = await client.run_with_answer(
        tk,
        halted.messages,
        halted.pending,
        relay_answer(halted.pending.id, [RelayResult(id="c1", output="a")]),
    )

    assert done.tool_calls[1].is_error
    assert done.tool_calls[1].output == "no result supplied on resume for beta"


async def test_a_single_call_request_takes_the_output_shorthand_and_a_multi_call_one_does_not():
    tk = await relay_kit("alpha", "beta")
    one = await halt_on(["alpha"], tk)
    two = await halt_on(["alpha", "beta"], tk)
    assert one.pending is not None
    assert two.pending is not None
    client = create_in_process_client(generate=Script([echo_tool_outputs]))

    done = await client.run_with_answer(
        tk, one.messages, one.pending, answer_output(one.pending.id, "short")
    )
    assert done.text == "short"
    with pytest.raises(ResumeError, match="shorthand"):
        await client.run_with_answer(
            tk, two.messages, two.pending, answer_output(two.pending.id, "short")
        )


# Rule 7


async def test_a_declined_answer_gives_every_call_an_error_with_the_reason_and_the_run_goes_on():
    tk = await relay_kit("alpha", "beta")
    model = Script([calls(("c1", "alpha"), ("c2", "beta")), text("coped")])
    client = create_in_process_client(generate=model)
    halted = await client.run("go", tk)
    assert halted.pending is not None

    done = await client.run_with_answer(
        tk, halted.messages, halted.pending, answer_declined(halted.pending.id, "not today")
    )

    assert done.status == "done"
    assert done.text == "coped"
    assert all(t.is_error and "not today" in t.output for t in done.tool_calls)
    assert len(done.tool_calls) == 2


async def test_a_host_reported_failure_is_an_error_result_and_the_run_goes_on():
    tk = await relay_kit("alpha")
    model = Script([calls(("c1", "alpha")), echo_tool_outputs])
    client = create_in_process_client(generate=model)
    halted = await client.run("go", tk)
    assert halted.pending is not None

    done = await client.run_with_answer(
        tk,
        halted.messages,
        halted.pending,
        answer_output(halted.pending.id, "disk full", is_error=True),
    )

    assert done.status == "done"
    assert (done.tool_calls[0].output, done.tool_calls[0].is_error) == ("disk full", True)
    tool_msg = tool_messages(model.seen[1])[0]
    assert tool_msg["content"] == "disk full"


# Rule 8


async def test_ask_keeps_the_conversation_across_a_halt_and_a_later_question():
    tk = await relay_kit("lookup")
    model = Script([calls(("c1", "lookup")), echo_tool_outputs, text("second answer")])
    store = InMemoryConversationStore()
    client = create_in_process_client(generate=model, store=store)

    halted = await client.ask("first?", tk, id="conv-1")
    assert halted.pending is not None
    assert (await store.load("conv-1")) == halted.messages
    resumed = await client.ask_with_answer(
        tk, "conv-1", halted.pending, answer_output(halted.pending.id, "found")
    )
    later = await client.ask("second?", tk, id="conv-1")

    assert resumed.text == "found"
    assert later.text == "second answer"
    assert [m["content"] for m in model.seen[2].messages if m["role"] == "user"] == [
        "first?",
        "second?",
    ]
    assert (await store.load("conv-1")) == later.messages
    assert await store.load("other") == []


# Rule 9


async def test_a_relay_tool_may_not_take_a_builtins_name_even_with_builtins_off():
    with pytest.raises(ToolkitError, match="bash") as err:
        await create_toolkit(
            builtins=BuiltinsConfig.off(), extra_tools=[relay_tool("bash", "host shell")]
        )
    assert err.value.tool == "bash"


async def test_an_ordinary_extra_tool_may_shadow_a_builtin(tmp_path):
    counts: dict[str, int] = {}
    mine = counter_tool("read", counts, output="my read")
    tk = await create_toolkit(extra_tools=[mine], base_dir=tmp_path)
    model = Script([calls(("c1", "read")), echo_tool_outputs])

    res = await create_in_process_client(generate=model).run("go", tk)

    assert tk.get("read") is mine
    assert [t.name for t in tk.tools].count("read") == 1
    assert res.text == "my read"
    assert counts == {"read": 1}


# Rule 10


def strip_run_ids(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in m.items() if k != "relayq" or m["role"] != "user"} for m in messages]


async def test_a_declared_relay_tool_that_is_never_called_changes_nothing_observable():
    counts: dict[str, int] = {}
    local = counter_tool("local", counts)
    plain = await create_toolkit(builtins=BuiltinsConfig.off(), extra_tools=[local])
    with_relay = await create_toolkit(
        builtins=BuiltinsConfig.off(), extra_tools=[local, relay_tool("lookup", "host")]
    )
    runs = []
    for tk in (plain, with_relay):
        model = Script([calls(("c1", "local")), echo_tool_outputs])
        runs.append(await create_in_process_client(generate=model).run("go", tk))

    a, b = (r.model_dump(exclude={"run_id", "messages"}) for r in runs)
    assert a == b
    assert strip_run_ids(runs[0].messages) == strip_run_ids(runs[1].messages)
    assert counts == {"local": 2}
    assert with_relay.to_openai()[:-1] == plain.to_openai()


# Rule 11


async def test_a_halted_run_resumes_after_a_json_round_trip_with_a_fresh_client_and_toolkit():
    model = Script([calls(("c1", "alpha"), ("c2", "beta")), echo_tool_outputs])
    halted = await create_in_process_client(generate=model).run(
        "go", await relay_kit("alpha", "beta")
    )
    assert halted.pending is not None
    wire = json.dumps(
        {
            "messages": halted.messages,
            "pending": halted.pending.model_dump(mode="json"),
            "answer": relay_answer(
                halted.pending.id,
                [RelayResult(id="c2", output="B"), RelayResult(id="c1", output="A")],
            ).model_dump(mode="json"),
        }
    )

    back = json.loads(wire)
    fresh_kit = await relay_kit("alpha", "beta")
    fresh = create_in_process_client(generate=Script([echo_tool_outputs]))
    done = await fresh.run_with_answer(fresh_kit, back["messages"], back["pending"], back["answer"])

    assert done.text == "A,B"
    assert done.run_id == halted.run_id


# Rule 12


async def test_a_relay_tool_called_in_successive_turns_halts_each_time_with_a_new_request():
    tk = await relay_kit("lookup")

    def model(req: InProcessRequest) -> InProcessResponse:
        done = len(tool_messages(req))
        return calls(("c1", "lookup")) if done < 3 else echo_tool_outputs(req)

    client = create_in_process_client(generate=model)
    res = await client.run("go", tk)
    ids = []
    while res.status == "pending":
        assert res.pending is not None
        ids.append(res.pending.id)
        res = await client.run_with_answer(
            tk, res.messages, res.pending, answer_output(res.pending.id, f"r{len(ids)}")
        )

    assert res.text == "r1,r2,r3"
    assert len(ids) == 3
    assert len(set(ids)) == 3


ROOT = Path(__file__).resolve().parents[2]


async def test_a_run_halted_in_one_process_resumes_in_another():

    def step(name: str, stdin: str = "") -> dict[str, Any]:
        out = forkserver.run(
            [sys.executable, "-m", "tests.relayq.crossproc", name],
            input=stdin, capture_output=True, text=True, cwd=ROOT, check=True, timeout=30,
        )  # fmt: skip
        return json.loads(out.stdout)

    halted = step("halt")
    done = step("resume", json.dumps(halted))

    assert halted["status"] == "pending"
    assert done["status"] == "done"
    assert done["text"] == "ALPHA,BETA"
    assert done["runId"] == halted["runId"]

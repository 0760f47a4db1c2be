"""The three examples of the relay-tools contract, ported with the same models and assertions."""

from __future__ import annotations

from typing import Any

from relayq import (
    BuiltinsConfig,
    InProcessRequest,
    InProcessResponse,
    InProcessToolCall,
    Request,
    ToolContext,
    create_in_process_client,
    create_toolkit,
    define_tool,
)
from relayq.relay import (
    RelayResult,
    answer_declined,
    answer_output,
    is_relay_request,
    relay_answer,
    relay_calls_of,
    relay_tool,
)


def weather_model(req: InProcessRequest) -> InProcessResponse:
    if any(m["role"] == "tool" for m in req.messages):
        return InProcessResponse(content="it is sunny")
    return InProcessResponse(
        tool_calls=[InProcessToolCall(id="c1", name="lookup", arguments={"q": "weather"})]
    )


async def test_example_1_the_relay_call_reaches_the_host_and_nothing_runs_locally() -> None:
    lookup = relay_tool(
        "lookup",
        "look something up",
        {"type": "object", "properties": {"q": {"type": "string"}}},
    )
    tk = await create_toolkit(builtins=BuiltinsConfig.off(), extra_tools=[lookup])
    got: list[Request] = []

    def wait_for(req: Request) -> Any:
        got.append(req)
        return answer_output(req.id, "sunny, 31C")  # the HOST ran the lookup

    client = create_in_process_client(generate=weather_model, wait_for=wait_for)

    res = await client.run("weather?", tk)

    assert res.status == "done"
    assert res.text == "it is sunny"
    assert len(got) == 1, "wait_for saw the relay request"
    assert is_relay_request(got[0]), f"expected a relay request, got kind={got[0].kind!r}"
    calls = relay_calls_of(got[0])
    assert len(calls) == 1
    assert (calls[0].id, calls[0].name) == ("c1", "lookup")
    assert calls[0].input["q"] == "weather"
    assert res.tool_calls[0].output == "sunny, 31C", "the host's output became the tool result"
    assert not res.tool_calls[0].is_error


def three_calls_model(req: InProcessRequest) -> InProcessResponse:
    outs = [str(m["content"]) for m in req.messages if m["role"] == "tool"]
    if outs:
        return InProcessResponse(content=",".join(outs))
    return InProcessResponse(
        tool_calls=[
            InProcessToolCall(id="c1", name="alpha", arguments={}),
            InProcessToolCall(id="c2", name="beta", arguments={}),
            InProcessToolCall(id="c3", name="gamma", arguments={}),
        ]
    )


async def test_example_2_three_relay_calls_in_one_turn_ride_a_single_suspension() -> None:
    relays = [relay_tool(n, "relayed to the caller") for n in ("alpha", "beta", "gamma")]
    tk = await create_toolkit(builtins=BuiltinsConfig.off(), extra_tools=relays)
    client = create_in_process_client(generate=three_calls_model)

    halted = await client.run("do all three", tk)
    assert halted.status == "pending", "expected a durable halt"
    assert halted.pending is not None
    req = halted.pending
    calls = relay_calls_of(req)
    names = [c.name for c in calls]
    assert names == ["alpha", "beta", "gamma"], "all 3 on ONE request, tool-call order preserved"

    # The host executes each call and answers them together, keyed by call id.
    results = [RelayResult(id=c.id, output=f"{c.name}-done") for c in calls]
    done = await client.run_with_answer(tk, halted.messages, req, relay_answer(req.id, results))
    assert done.text == "alpha-done,beta-done,gamma-done"


async def test_example_3_a_real_tool_runs_beside_a_relay_and_a_decline_does_not_abort() -> None:
    real_ran = False

    def real(args: dict[str, Any], ctx: ToolContext) -> str:
        nonlocal real_ran
        real_ran = True
        return "real-output"

    def model(req: InProcessRequest) -> InProcessResponse:
        def call(id: str, name: str) -> InProcessResponse:
            return InProcessResponse(tool_calls=[InProcessToolCall(id=id, name=name)])

        match sum(1 for m in req.messages if m["role"] == "tool"):
            case 0:
                return call("c1", "real_tool")
            case 1:
                return call("c2", "relayed_tool")
            case _:
                return InProcessResponse(content="handled the decline")

    tk = await create_toolkit(
        builtins=BuiltinsConfig.off(),
        extra_tools=[
            define_tool("real_tool", "runs locally", None, real),
            relay_tool("relayed_tool", "runs at the host"),
        ],
    )
    # The caller declines the relayed call: the run must not abort.
    client = create_in_process_client(
        generate=model, wait_for=lambda req: answer_declined(req.id, "")
    )

    res = await client.run("do both", tk)

    assert real_ran, "expected the ordinary tool to actually run"
    assert res.status == "done", "a declined relay must not abort the run"
    assert res.tool_calls[1].is_error, "the declined relay is an error tool result"
    assert res.text == "handled the decline"

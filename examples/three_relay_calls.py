"""Three relay calls in one turn ride one suspension; the host answers them by call id.

Run it with `make demo` or `python -m examples.three_relay_calls`.
"""

from __future__ import annotations

import asyncio
import json

from relayq import (
    BuiltinsConfig,
    InProcessRequest,
    InProcessResponse,
    InProcessToolCall,
    create_in_process_client,
    create_toolkit,
)
from relayq.relay import RelayResult, relay_answer, relay_calls_of, relay_tool


def model(req: InProcessRequest) -> InProcessResponse:
    """A stand-in model: asks for three tools, then reports what they returned."""
    outputs = [str(m["content"]) for m in req.messages if m["role"] == "tool"]
    if outputs:
        return InProcessResponse(content=",".join(outputs))
    return InProcessResponse(
        tool_calls=[
            InProcessToolCall(id="c1", name="alpha", arguments={}),
            InProcessToolCall(id="c2", name="beta", arguments={}),
            InProcessToolCall(id="c3", name="gamma", arguments={}),
        ]
    )


async def main() -> None:
    relays = [relay_tool(name, "relayed to the caller") for name in ("alpha", "beta", "gamma")]
    toolkit = await create_toolkit(builtins=BuiltinsConfig.off(), extra_tools=relays)
    client = create_in_process_client(generate=model)

    halted = await client.run("do all three", toolkit)
    assert halted.pending is not None
    print(f"run {halted.run_id} is {halted.status}, waiting on request {halted.pending.id}:")
    print(json.dumps(halted.pending.model_dump(mode="json"), indent=2))

    # The host runs each call and answers them together, keyed by call id.
    calls = relay_calls_of(halted.pending)
    results = [RelayResult(id=c.id, output=f"{c.name}-done") for c in calls]
    answer = relay_answer(halted.pending.id, results)
    done = await client.run_with_answer(toolkit, halted.messages, halted.pending, answer)

    print(f"run {done.run_id} is {done.status} after {done.turns} turns: {done.text}")


if __name__ == "__main__":
    asyncio.run(main())

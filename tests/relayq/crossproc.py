"""Halts a run in one process, resumes it in another.

Usage: `python -m tests.relayq.crossproc halt|resume`.

Reads and writes JSON on stdin/stdout only, as a host would across a network.
"""

from __future__ import annotations

import asyncio
import json
import sys

from relayq import BuiltinsConfig, Request, create_in_process_client, create_toolkit
from relayq.relay import RelayResult, relay_answer, relay_calls_of, relay_tool

from .scripted import Script, calls, echo_tool_outputs


async def main(step: str) -> None:
    tk = await create_toolkit(
        builtins=BuiltinsConfig.off(),
        extra_tools=[relay_tool("alpha", "h"), relay_tool("beta", "h")],
    )
    model = Script([calls(("c1", "alpha"), ("c2", "beta")), echo_tool_outputs])
    client = create_in_process_client(generate=model)
    if step == "halt":
        res = await client.run("go", tk)
        print(res.model_dump_json())
        return
    halted = json.loads(sys.stdin.read())
    pending = halted["pending"]
    results = [
        RelayResult(id=c.id, output=c.name.upper())
        for c in relay_calls_of(Request.model_validate(pending))
    ]
    answer = relay_answer(pending["id"], results[::-1]).model_dump(mode="json")
    done = await create_in_process_client(generate=Script([echo_tool_outputs])).run_with_answer(
        tk, halted["messages"], pending, answer
    )
    print(done.model_dump_json())


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))

"""Agents whose tools harm their worker (`RELAYQ_AGENTS=tests.durable.poison_agents`).

`wedge`: one call of a sync tool that never returns (it sleeps `RELAYQ_TEST_WEDGE`
seconds, 600 unless set), with no timeout: the turn's time limit gives up on it.
`wedge_bounded`: the same tool under the agent's `tool_timeout` of 1 s: the call's
result is an error, and the run goes on to its end.
`hog`: one call of a tool that allocates `RELAYQ_TEST_HOG_MIB` (400) and keeps it.
`kill`: one call of a tool that ends its process (`os._exit`, as a crash in a C extension);
its first attempts wait (10 s at most) until `RELAYQ_TEST_KILLS` of them are in the same
process, so that one death takes them all, as poison runs in flight together.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from datetime import timedelta

from relayq import Agent, InProcessRequest, InProcessResponse, ToolContext, define_tool

from .agents import calls, note, tool_outputs


def wedge(args: dict[str, object], ctx: ToolContext) -> str:
    note("tool", f"wedge {ctx.run_id} attempt {ctx.attempt}")
    time.sleep(float(os.environ.get("RELAYQ_TEST_WEDGE", "600")))
    return "unwedged"


async def wedge_model(req: InProcessRequest) -> InProcessResponse:
    outputs = tool_outputs(req)
    if outputs:
        return InProcessResponse(content=f"after the wedge: {outputs[-1]}")
    return calls(("c1", "wedge"))


WEDGE = define_tool("wedge", "w", None, wedge)

wedged = Agent("wedge", wedge_model, tools=[WEDGE])
bounded = Agent("wedge_bounded", wedge_model, tools=[WEDGE], tool_timeout=timedelta(seconds=1))


KEPT: list[bytearray] = []
"""What the `hog` tool allocated: kept for the life of the process, as a leak is."""


async def hog(args: dict[str, object], ctx: ToolContext) -> str:
    mib = int(os.environ.get("RELAYQ_TEST_HOG_MIB", "400"))
    KEPT.append(bytearray(b"\x01") * (mib * 2**20))  # written: resident, not just reserved
    note("tool", f"hog {ctx.run_id} attempt {ctx.attempt}")
    return f"kept {mib} MiB"


async def hog_model(req: InProcessRequest) -> InProcessResponse:
    outputs = tool_outputs(req)
    if outputs:
        return InProcessResponse(content=outputs[-1])
    return calls(("c1", "hog"))


hogging = Agent("hog", hog_model, tools=[define_tool("hog", "h", None, hog)])


_TOGETHER = threading.Barrier(int(os.environ.get("RELAYQ_TEST_KILLS", "1")), timeout=10)


def kill(args: dict[str, object], ctx: ToolContext) -> str:
    note("tool", f"kill {ctx.run_id} attempt {ctx.attempt} pid {os.getpid()}")
    if ctx.attempt == 1:
        with contextlib.suppress(threading.BrokenBarrierError):
            _TOGETHER.wait()
    os._exit(1)


def kill_model(req: InProcessRequest) -> InProcessResponse:
    return calls(("c1", "kill"))


killing = Agent("kill", kill_model, tools=[define_tool("kill", "k", None, kill)])

"""Agents the durable tests run on real workers (`RELAYQ_AGENTS=tests.durable.agents`).

Models and tools write what they do to files under `RELAYQ_TEST_LOG`, so a
test in another process can count model calls and tool executions.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlmodel import col, select

from relayq import (
    Agent,
    InProcessRequest,
    InProcessResponse,
    InProcessToolCall,
    ModelError,
    Request,
    ToolContext,
    define_tool,
    pending,
)
from relayq.approvals import requires_approval
from relayq.relay import relay_tool
from store import Database, LedgerRow
from tests.durable import sent_messages  # noqa: F401  (what this process sends, recorded)


def log_dir() -> Path:
    path = Path(os.environ.get("RELAYQ_TEST_LOG", ".relayq/test-log"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def note(kind: str, key: str) -> int:
    """Append a line to `<kind>.log` and return how many lines with `key` it now has."""
    path = log_dir() / f"{kind}.log"
    with path.open("a") as f:
        f.write(key + "\n")
    return count(kind, key)


def count(kind: str, key: str) -> int:
    path = log_dir() / f"{kind}.log"
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if line == key)


def prompt_of(req: InProcessRequest) -> str:
    return next(str(m["content"]) for m in req.messages if m["role"] == "user")


def tool_outputs(req: InProcessRequest) -> list[str]:
    return [str(m["content"]) for m in req.messages if m["role"] == "tool"]


def calls(*pairs: tuple[str, str]) -> InProcessResponse:
    return InProcessResponse(tool_calls=[InProcessToolCall(id=i, name=n) for i, n in pairs])


# The seed's example 2: three relay calls in one turn.
def three_calls_model(req: InProcessRequest) -> InProcessResponse:
    note("model", prompt_of(req))
    outs = tool_outputs(req)
    if outs:
        return InProcessResponse(content=",".join(outs))
    return calls(("c1", "alpha"), ("c2", "beta"), ("c3", "gamma"))


seed_three = Agent(
    "seed-three",
    three_calls_model,
    tools=[relay_tool(n, "relayed to the caller") for n in ("alpha", "beta", "gamma")],
)


# The seed's example 3: a real tool beside a relayed one that the host declines.
def real_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    note("tool", f"real_tool {ctx.run_id}")
    return "real-output"


def real_then_relay_model(req: InProcessRequest) -> InProcessResponse:
    note("model", prompt_of(req))
    match len(tool_outputs(req)):
        case 0:
            return calls(("c1", "real_tool"))
        case 1:
            return calls(("c2", "relayed_tool"))
        case _:
            return InProcessResponse(content="handled the decline")


seed_decline = Agent(
    "seed-decline",
    real_then_relay_model,
    tools=[
        define_tool("real_tool", "runs locally", None, real_tool),
        relay_tool("relayed_tool", "runs at the host"),
    ],
)


# One relay call; the answer comes back as the final text.
def lookup_model(req: InProcessRequest) -> InProcessResponse:
    note("model", prompt_of(req))
    outs = tool_outputs(req)
    if outs:
        return InProcessResponse(content=",".join(outs))
    return calls(("c1", "lookup"))


lookup = Agent("lookup", lookup_model, tools=[relay_tool("lookup", "the host looks it up")])
expiring = Agent(
    "expiring",
    lookup_model,
    tools=[relay_tool("lookup", "the host looks it up")],
    request_ttl=timedelta(milliseconds=300),
)
expiring_cancel = Agent(
    "expiring-cancel",
    lookup_model,
    tools=[relay_tool("lookup", "the host looks it up")],
    request_ttl=timedelta(milliseconds=300),
    on_expiry="cancel",
)


# A turn whose second tool kills the worker process the first time it runs.
def work(args: dict[str, Any], ctx: ToolContext) -> str:
    note("tool", f"work {ctx.run_id}")
    return "worked"


def recorded(db: Database, run_id: str, call_id: str) -> bool:
    """Whether the call's outcome is in the ledger."""
    with db.read() as s:
        finished = select(LedgerRow).where(
            LedgerRow.run_id == run_id,
            LedgerRow.call_id == call_id,
            col(LedgerRow.outcome).is_not(None),
        )
        return s.exec(finished).first() is not None


def crash(args: dict[str, Any], ctx: ToolContext) -> str:
    # `work` (c1) must have finished and reached the ledger before this call dies
    # (polled in the worker's store); if it never does, the call fails and the
    # test with it, rather than passing without showing anything.
    db = Database(os.environ["RELAYQ_DATABASE_URL"])
    try:
        deadline = time.monotonic() + 20
        while not recorded(db, ctx.run_id, "c1"):
            if time.monotonic() > deadline:
                raise RuntimeError("`work` did not reach the ledger within 20 s")
            time.sleep(0.02)
    finally:
        db.dispose()
    if note("tool", f"crash {ctx.run_id}") == 1:
        os._exit(1)
    return f"survived {ctx.idempotency_key} attempt {ctx.attempt}"


def crashy_model(req: InProcessRequest) -> InProcessResponse:
    note("model", prompt_of(req))
    outs = tool_outputs(req)
    if outs:
        return InProcessResponse(content=",".join(outs))
    return calls(("c1", "work"), ("c2", "crash"))


crashy = Agent(
    "crashy",
    crashy_model,
    tools=[define_tool("work", "w", None, work), define_tool("crash", "c", None, crash)],
)


# A turn whose tool kills the worker process every time it runs.
def doom(args: dict[str, Any], ctx: ToolContext) -> str:
    note("tool", f"doom {ctx.run_id}")
    os._exit(1)


def doomed_model(req: InProcessRequest) -> InProcessResponse:
    return calls(("c1", "doom"))


doomed = Agent("doomed", doomed_model, tools=[define_tool("doom", "d", None, doom)])


# A model that is rate limited twice per prompt, and one that always is.
def flaky_model(req: InProcessRequest) -> InProcessResponse:
    if note("model", prompt_of(req)) <= 2:
        raise ModelError("429 rate limited", retryable=True, retry_after=0.05)
    return InProcessResponse(content="finally")


def overloaded_model(req: InProcessRequest) -> InProcessResponse:
    note("model", prompt_of(req))
    raise ModelError("529 overloaded", retryable=True)


def refusing_model(req: InProcessRequest) -> InProcessResponse:
    note("model", prompt_of(req))
    raise ModelError("400 bad request: no such model", retryable=False)


flaky = Agent("flaky", flaky_model)
overloaded = Agent("overloaded", overloaded_model)
refusing = Agent("refusing", refusing_model)


# A model with a bug of its user's: an exception of its own, raised two calls down.
class OrderBookError(Exception):
    pass


def order_of(prompt: str) -> str:
    raise OrderBookError("order 17 is not in the book")


def buggy_model(req: InProcessRequest) -> InProcessResponse:
    note("model", prompt_of(req))
    return InProcessResponse(content=order_of(prompt_of(req)))


buggy = Agent("buggy", buggy_model)


# An approval-gated tool: a non-relay suspension.
def deploy(args: dict[str, Any], ctx: ToolContext) -> str | Request:
    if ctx.answer is None:
        return pending("approval", "Deploy to production?", {"service": "web"})
    note("tool", f"deploy {ctx.run_id}")
    return f"deployed, approved by {(ctx.answer.data or {}).get('by', '?')}"


def deploy_model(req: InProcessRequest) -> InProcessResponse:
    note("model", prompt_of(req))
    outs = tool_outputs(req)
    if outs:
        return InProcessResponse(content=",".join(outs))
    return calls(("c1", "deploy"))


approvals = Agent("approvals", deploy_model, tools=[define_tool("deploy", "d", None, deploy)])


# A tool that holds its turn until a file appears, so a test can act meanwhile.
def hold(args: dict[str, Any], ctx: ToolContext) -> str:
    note("tool", f"hold {ctx.run_id}")
    gate = log_dir() / f"release-{ctx.run_id}"
    deadline = time.monotonic() + 20
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    # How it ended: a run that ends only because the tool gave up proves no release.
    ended = "released" if gate.exists() else "never released"
    note("tool", f"hold {ctx.run_id} {ended}")
    return ended


def holding_model(req: InProcessRequest) -> InProcessResponse:
    note("model", prompt_of(req))
    if tool_outputs(req):
        return InProcessResponse(content="released")
    return calls(("c1", "hold"))


holding = Agent("holding", holding_model, tools=[define_tool("hold", "h", None, hold)])


# Two turns: a local tool, then the final text. A turn taken twice shows in the counts.
def step(args: dict[str, Any], ctx: ToolContext) -> str:
    note("tool", f"step {ctx.run_id}")
    return "stepped"


def two_step_model(req: InProcessRequest) -> InProcessResponse:
    note("model", prompt_of(req))
    outs = tool_outputs(req)
    if outs:
        return InProcessResponse(content=",".join(outs))
    return calls(("c1", "step"))


two_step = Agent("two-step", two_step_model, tools=[define_tool("step", "s", None, step)])


# Replies with every user message of its conversation, so a test sees what it was given.
def recall_model(req: InProcessRequest) -> InProcessResponse:
    users = [str(m["content"]) for m in req.messages if m["role"] == "user"]
    note("model", users[-1])
    return InProcessResponse(content=" | ".join(users))


recall = Agent("recall", recall_model)


# Rate limited twice with a Retry-After; logs when each try came.
def patient_model(req: InProcessRequest) -> InProcessResponse:
    key = prompt_of(req)
    with (log_dir() / "model-times.log").open("a") as f:
        f.write(f"{key}\t{time.time()}\n")
    if note("model", key) <= 2:
        raise ModelError("429 rate limited", retryable=True, retry_after=0.4)
    return InProcessResponse(content="patiently")


patient = Agent("patient", patient_model)


# A model that answers only once `RELAYQ_TEST_CROWD` of its calls wait at the same time:
# it finishes only on a worker that keeps that many turns in flight at once.
_crowd: dict[int, asyncio.Barrier] = {}


async def crowd_model(req: InProcessRequest) -> InProcessResponse:
    size = int(os.environ.get("RELAYQ_TEST_CROWD", "20"))
    barrier = _crowd.setdefault(id(asyncio.get_running_loop()), asyncio.Barrier(size))
    note("model", prompt_of(req))
    try:
        wait = float(os.environ.get("RELAYQ_TEST_CROWD_WAIT", "15"))
        await asyncio.wait_for(barrier.wait(), timeout=wait)
    except TimeoutError:
        raise ModelError(f"fewer than {size} turns were in flight at once") from None
    return InProcessResponse(content="together")


crowd = Agent("crowd", crowd_model)


# Fault probes: runs slow enough that a worker killed at any moment holds turns
# in flight, each with a local tool and a relay call the host answers. The
# sleeps are the behaviour under test (turns in flight), not synchronisation.
async def pace(args: dict[str, Any], ctx: ToolContext) -> str:
    note("tool", f"pace {ctx.run_id} attempt {ctx.attempt}")
    await asyncio.sleep(0.4)
    return f"paced {ctx.idempotency_key}"


async def steady_model(req: InProcessRequest) -> InProcessResponse:
    await asyncio.sleep(0.2)
    outs = tool_outputs(req)
    if not outs:
        return calls(("c1", "pace"))
    if len(outs) == 1:
        return calls(("c2", "approve"))
    return InProcessResponse(content=" | ".join(outs))


steady = Agent(
    "steady",
    steady_model,
    tools=[define_tool("pace", "p", None, pace), relay_tool("approve", "the host approves")],
)


# Rate limited once, asked to come back in a few seconds: the retry's message
# waits in its worker (an ETA) meanwhile.
def later_model(req: InProcessRequest) -> InProcessResponse:
    if note("model", prompt_of(req)) == 1:
        raise ModelError("429 rate limited", retryable=True, retry_after=3.0)
    return InProcessResponse(content="came back")


later = Agent("later", later_model)


def much_later_model(req: InProcessRequest) -> InProcessResponse:
    if note("model", prompt_of(req)) == 1:
        raise ModelError("429 rate limited", retryable=True, retry_after=120.0)
    return InProcessResponse(content="came back")


much_later = Agent("much-later", much_later_model)
"""As `later`, its retry two minutes away: a worker holds the message that long."""


# Refunds that two people in finance must approve; the one who asked may not.
REFUND_SCHEMA = {
    "type": "object",
    "properties": {"order": {"type": "string"}, "amount": {"type": "number", "maximum": 1000}},
    "required": ["order", "amount"],
    "additionalProperties": False,
}


def refund(args: dict[str, Any], ctx: ToolContext) -> str:
    note("tool", f"refund {ctx.run_id} {args['amount']}")
    return f"refunded {args['amount']} on order {args['order']}"


def refunds_model(req: InProcessRequest) -> InProcessResponse:
    outs = tool_outputs(req)
    if outs:
        return InProcessResponse(content=outs[0])
    return InProcessResponse(
        tool_calls=[
            InProcessToolCall(id="c1", name="refund", arguments={"order": "17", "amount": 500})
        ]
    )


refunds = Agent(
    "refunds",
    refunds_model,
    tools=[
        requires_approval(
            define_tool("refund", "Refund an order", REFUND_SCHEMA, refund),
            approvers=["finance"],
            quorum=2,
            forbid_self_approval=True,
            prompt=lambda args: f"Refund {args.get('amount')} on order {args.get('order')}?",
        )
    ],
)


# The inbox's refunds: the arguments come from the prompt, a JSON object
# ({"order", "amount", "note"}), so each test makes requests it can find again.
DESK_SCHEMA = {
    "type": "object",
    "properties": {
        "order": {"type": "string", "description": "The order to refund"},
        "amount": {"type": "number", "maximum": 1000, "description": "In euros"},
        "note": {"type": "string"},
    },
    "required": ["order", "amount"],
    "additionalProperties": False,
}


def desk_refund(args: dict[str, Any], ctx: ToolContext) -> str:
    note("tool", f"desk {ctx.run_id} {args['amount']}")
    return f"refunded {args['amount']} on order {args['order']}"


def desk_model(req: InProcessRequest) -> InProcessResponse:
    outs = tool_outputs(req)
    if outs:
        return InProcessResponse(content=outs[0])
    arguments = json.loads(prompt_of(req))
    return InProcessResponse(
        tool_calls=[InProcessToolCall(id="c1", name="refund", arguments=arguments)]
    )


def _desk(name: str, quorum: int) -> Agent:
    return Agent(
        name,
        desk_model,
        tools=[
            requires_approval(
                define_tool("refund", "Refund an order", DESK_SCHEMA, desk_refund),
                approvers=["finance"],
                quorum=quorum,
                prompt=lambda args: f"Refund {args.get('amount')} on order {args.get('order')}?",
            )
        ],
    )


desk = _desk("desk", 1)
desk_pair = _desk("desk_pair", 2)


# A desk whose policy spares people: over 900 is refused at once, up to 10 runs unasked.
guarded = Agent(
    "guarded",
    desk_model,
    tools=[
        requires_approval(
            define_tool("refund", "Refund an order", DESK_SCHEMA, desk_refund),
            approvers=["finance"],
            deny=["amount > 900"],
            when=lambda args, ctx: args["amount"] > 10,
            max_grant_scope="agent",
        )
    ],
)


# Relay tools a host serves over the API (`api._relay`, `relayq host`): the model asks
# for `shell` with the prompt as its command (and `browser_click` too when the prompt
# says "click"), then ends with what the host answered.
def hosted_model(req: InProcessRequest) -> InProcessResponse:
    outs = tool_outputs(req)
    if outs:
        return InProcessResponse(content=" | ".join(outs))
    prompt = prompt_of(req)
    asked = [InProcessToolCall(id="c1", name="shell", arguments={"cmd": prompt})]
    if "click" in prompt:
        asked.append(InProcessToolCall(id="c2", name="browser_click", arguments={"at": "#ok"}))
    return InProcessResponse(tool_calls=asked)


hosted = Agent(
    "hosted",
    hosted_model,
    tools=[
        relay_tool("shell", "runs a command on the host"),
        relay_tool("browser_click", "clicks in the host's browser"),
    ],
)

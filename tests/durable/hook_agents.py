"""Hooks and an agent for the hooks tests (tests/tasks/test_hooks.py, tests/durable/test_hooks.py).

`hooked` calls its local tool `stamp`, then the relay tool `confirm`, then ends,
reporting usage on every reply. `FileHook`, named in `RELAYQ_HOOKS` for a worker,
writes each event it sees as one line of `hooks.log` under `RELAYQ_TEST_LOG`, so a
test in another process reads what the worker's hooks saw. `Recorder` keeps what it is
told of in a list, in this process; `Broken` fails in each hook it has.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from relayq import Agent, InProcessRequest, InProcessResponse, InProcessToolCall, Usage, define_tool
from relayq.relay import relay_tool
from tasks.hooks import (
    ModelCalled,
    ModelCalling,
    RequestOpened,
    RunHooks,
    RunSettled,
    ToolRan,
    TurnEnded,
    TurnStarted,
)

USAGE = Usage(prompt_tokens=10, completion_tokens=3)


def hooked_model(req: InProcessRequest) -> InProcessResponse:
    tools = [m for m in req.messages if m["role"] == "tool"]
    if not tools:
        return InProcessResponse(tool_calls=[InProcessToolCall(id="s1", name="stamp")], usage=USAGE)
    if len(tools) == 1:
        calls = [InProcessToolCall(id="c1", name="confirm")]
        return InProcessResponse(tool_calls=calls, usage=USAGE)
    return InProcessResponse(content="confirmed", usage=USAGE)


def stamp(args: dict[str, Any], ctx: Any) -> str:
    return "stamped"


def hooked_agent(
    name: str = "hooked", *, hooks: Sequence[RunHooks] = (), register: bool = True
) -> Agent:
    return Agent(
        name,
        hooked_model,
        tools=[
            define_tool("stamp", "stamps locally", None, stamp),
            relay_tool("confirm", "a person confirms"),
        ],
        hooks=hooks,
        register=register,
    )


hooked = hooked_agent()


class FileHook(RunHooks):
    """Each event this worker's hooks see, as a line of `hooks.log`."""

    def __init__(self) -> None:
        folder = Path(os.environ.get("RELAYQ_TEST_LOG", ".relayq/test-log"))
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "hooks.log"

    def _write(self, kind: str, run_id: str, **more: Any) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"kind": kind, "run": run_id, **more}) + "\n")

    def before_turn(self, event: TurnStarted) -> None:
        self._write("before_turn", event.run_id, turn=event.turn)

    def after_turn(self, event: TurnEnded) -> None:
        self._write("after_turn", event.run_id, outcome=event.outcome.value, turn=event.turn)

    def after_model_call(self, event: ModelCalled) -> None:
        tokens = event.usage.prompt_tokens + event.usage.completion_tokens if event.usage else 0
        self._write("after_model_call", event.run_id, tokens=tokens)

    def after_tool(self, event: ToolRan) -> None:
        self._write("after_tool", event.run_id, call=event.call_id)

    def after_request_opened(self, event: RequestOpened) -> None:
        self._write("after_request_opened", event.run_id, request_kind=event.kind)

    def after_run_settled(self, event: RunSettled) -> None:
        self._write("after_run_settled", event.run_id, status=event.status)


class TokensPerTenant(RunHooks):
    """The docs' example: tokens counted per tenant, the agent name's first part."""

    def __init__(self) -> None:
        self.tokens: Counter[str] = Counter()

    def after_model_call(self, event: ModelCalled) -> None:
        if event.usage is not None:
            tenant = event.agent.split(".", 1)[0]
            self.tokens[tenant] += event.usage.prompt_tokens + event.usage.completion_tokens


tokens_per_tenant = TokensPerTenant()
"""One instance, for `RELAYQ_HOOKS=tests.durable.hook_agents:tokens_per_tenant`."""


class Recorder(RunHooks):
    """Every event it is told of, as (its name, the method, the event)."""

    def __init__(self, name: str, seen: list[tuple[str, str, Any]]) -> None:
        self.name = name
        self.seen = seen

    def before_turn(self, event: TurnStarted) -> None:
        self.seen.append((self.name, "before_turn", event))

    def after_turn(self, event: TurnEnded) -> None:
        self.seen.append((self.name, "after_turn", event))

    def before_model_call(self, event: ModelCalling) -> None:
        self.seen.append((self.name, "before_model_call", event))

    async def after_model_call(self, event: ModelCalled) -> None:  # async hooks are awaited
        self.seen.append((self.name, "after_model_call", event))

    def after_tool(self, event: ToolRan) -> None:
        self.seen.append((self.name, "after_tool", event))

    def after_run_settled(self, event: RunSettled) -> None:
        self.seen.append((self.name, "after_run_settled", event))


class Broken(RunHooks):
    def before_turn(self, event: TurnStarted) -> None:
        raise RuntimeError("the secret prompt")

    def after_turn(self, event: TurnEnded) -> None:
        raise RuntimeError("the secret prompt")

    def after_model_call(self, event: ModelCalled) -> None:
        raise RuntimeError("the secret prompt")

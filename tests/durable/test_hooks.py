"""Hooks (`tasks.hooks`): each event reaches every hook that overrides its method, in
order (`after_*` in reverse), a failing hook is logged and skipped, and the turn, the
answer and the cancel emit what happened, on an eager host and on a worker."""

from __future__ import annotations

import ast
import json
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from relayq import Agent, AgentError, Answer
from relayq.relay import RelayResult, relay_answer, relay_calls_of
from tasks import DurableClient, Settings
from tasks.hooks import (
    BadHook,
    Hooks,
    ModelCalled,
    ModelCalling,
    RunHooks,
    RunSettled,
    ToolRan,
    TurnEnded,
    TurnOutcome,
    TurnStarted,
    hooks_named,
)
from tests.durable import hook_agents
from tests.durable.hook_agents import TokensPerTenant, hooked_agent
from tests.waiting import until

from .conftest import SpareWorkers

START = TurnStarted("run_1", "a", 1, 1, None)
END = TurnEnded("run_1", "a", 1, TurnOutcome.DONE, 0.1)


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


async def test_before_hooks_run_in_order_and_after_hooks_in_reverse():
    seen: list[tuple[str, str, Any]] = []
    hooks = Hooks([Recorder("first", seen), Recorder("second", seen)])
    await hooks.emit("before_turn", START)
    await hooks.emit("after_turn", END, [Recorder("agent's", seen)])
    assert [(who, method) for who, method, _ in seen] == [
        ("first", "before_turn"),
        ("second", "before_turn"),
        ("agent's", "after_turn"),
        ("second", "after_turn"),
        ("first", "after_turn"),
    ]
    assert seen[0][2] is START


async def test_a_failing_hook_is_logged_by_name_and_type_and_the_others_still_run(caplog):
    seen: list[tuple[str, str, Any]] = []
    hooks = Hooks([Broken(), Recorder("after it", seen)])
    with caplog.at_level(logging.WARNING, logger="tasks.hooks"):
        await hooks.emit("before_turn", START)
    assert [(who, method) for who, method, _ in seen] == [("after it", "before_turn")]
    assert "hook Broken.before_turn failed (RuntimeError); skipped" in caplog.text
    assert "secret" not in caplog.text


async def test_a_hook_is_called_only_for_the_methods_it_overrides():
    seen: list[tuple[str, str, Any]] = []
    hooks = Hooks([RunHooks(), Recorder("x", seen)])
    await hooks.emit("after_request_opened", object())  # Recorder leaves it to the base
    await hooks.emit("after_tool", END)
    assert [(who, method) for who, method, _ in seen] == [("x", "after_tool")]


def test_only_run_hooks_are_taken():
    with pytest.raises(BadHook, match="is not a RunHooks"):
        Hooks([object()])  # type: ignore[list-item]


def test_relayq_hooks_names_classes_and_instances():
    found = hooks_named(
        ["tests.durable.hook_agents:TokensPerTenant", "tests.durable.hook_agents:tokens_per_tenant"]
    )
    assert isinstance(found[0], TokensPerTenant)
    assert found[1] is hook_agents.tokens_per_tenant


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("tests.durable.hook_agents", "a hook is named `module:Class`"),
        ("tests.no_such_module:Hook", "cannot load hook 'tests.no_such_module:Hook'"),
        ("tests.durable.hook_agents:Nope", "cannot load hook"),
        ("tests.durable.hook_agents:hooked", "is not a RunHooks"),
    ],
)
def test_a_bad_hook_name_is_a_clear_error(name, said):
    with pytest.raises(BadHook, match=said):
        hooks_named([name])


def test_a_worker_refuses_an_agent_whose_hook_is_not_one():
    agent = Agent("bad-hook", hook_agents.hooked_model, hooks=[object()], register=False)
    with pytest.raises(AgentError, match="is not a RunHooks"):
        Settings.load(env={}).check_agent(agent)


@pytest.fixture
async def eager(database_url: str, tmp_path: Path) -> AsyncIterator[DurableClient]:
    settings = Settings.load(
        env={
            "RELAYQ_HOME": str(tmp_path),
            "RELAYQ_DATABASE_URL": database_url,
            "RELAYQ_HOOKS": "tests.durable.hook_agents:tokens_per_tenant",
        }
    )
    client = DurableClient(eager=True, settings=settings)
    yield client
    client.close()


def confirmed(request: Any) -> Answer:
    return relay_answer(
        request.id, [RelayResult(id=c.id, output="yes") for c in relay_calls_of(request)]
    )


async def test_an_agent_s_hooks_see_its_turns_model_calls_tools_and_settling(eager):
    seen: list[tuple[str, str, Any]] = []
    tenant = f"acme{uuid.uuid4().hex[:6]}"
    agent = hooked_agent(f"{tenant}.support", hooks=[Recorder("agent", seen)], register=False)
    before = dict(hook_agents.tokens_per_tenant.tokens)

    first = await eager.run(agent, "stamp then confirm", timeout=30)
    assert first.status == "pending"
    assert first.pending is not None
    done = await eager.run_with_answer(first.pending, confirmed(first.pending), timeout=30)
    assert done.status == "done"

    methods = [method for _, method, _ in seen]
    assert methods == [
        # turn 1: the local tool ran, the next turn is queued
        "before_turn", "before_model_call", "after_model_call", "after_tool", "after_turn",
        # turn 2: the relay call suspends the run
        "before_turn", "before_model_call", "after_model_call", "after_turn",
        "after_run_settled",
        # turn 3, after the answer: done
        "before_turn", "before_model_call", "after_model_call", "after_turn",
        "after_run_settled",
    ]  # fmt: skip
    ended = [e for _, m, e in seen if m == "after_turn"]
    assert [e.outcome for e in ended] == [TurnOutcome.NEXT, TurnOutcome.PENDING, TurnOutcome.DONE]
    assert [e.turn for e in ended] == [1, 2, 3]
    assert ended[1].request_id == first.pending.id
    settled = [e for _, m, e in seen if m == "after_run_settled"]
    assert [e.status for e in settled] == ["pending", "done"]
    assert {e.run_id for e in settled} == {first.run_id}
    calls = [e for _, m, e in seen if m == "after_model_call"]
    assert {(c.result, c.provider, c.usage.prompt_tokens) for c in calls} == {
        ("ok", "in-process", 10)
    }
    tool = next(e for _, m, e in seen if m == "after_tool")
    assert (tool.call_id, tool.is_error) == ("s1", False)
    # RELAYQ_HOOKS' hook saw the same calls: the docs' tokens-per-tenant example.
    assert hook_agents.tokens_per_tenant.tokens[tenant] - before.get(tenant, 0) == 3 * 13


async def test_a_failing_hook_fails_no_run(eager):
    agent = hooked_agent("broken-hooks", hooks=[Broken()], register=False)
    first = await eager.run(agent, "stamp then confirm", timeout=30)
    assert first.pending is not None
    done = await eager.run_with_answer(first.pending, confirmed(first.pending), timeout=30)
    assert (done.status, done.text) == ("done", "confirmed")


async def test_a_worker_s_hooks_named_in_its_settings_see_its_turns(
    spare_workers: SpareWorkers, tmp_path: Path
):
    log = tmp_path / "hooklog"
    spare = spare_workers.start(
        RELAYQ_AGENTS="tests.durable.hook_agents",
        RELAYQ_HOOKS="tests.durable.hook_agents:FileHook",
        RELAYQ_TEST_LOG=str(log),
    )
    client = DurableClient(settings=spare.settings)
    try:
        first = await client.run("hooked", "stamp then confirm", timeout=30)
        assert first.pending is not None
        done = await client.run_with_answer(first.pending, confirmed(first.pending), timeout=30)
        assert done.status == "done"
    finally:
        client.close()

    def lines() -> list[dict[str, Any]]:
        path = log / "hooks.log"
        found = path.read_text().splitlines() if path.exists() else []
        return [e for e in map(json.loads, found) if e["run"] == first.run_id]

    # The last event is written after the run's result is stored.
    until(lambda: any(e.get("status") == "done" for e in lines()), what="the run to settle")
    kinds = [e["kind"] for e in lines()]
    # A turn's end is told after its next turn's message went: that turn may start first.
    assert sorted(kinds) == sorted(
        ["before_turn"] * 3 + ["after_model_call"] * 3 + ["after_turn"] * 3
        + ["after_tool", "after_request_opened"] + ["after_run_settled"] * 2
    )  # fmt: skip
    ended = sorted((e["turn"], e["outcome"]) for e in lines() if e["kind"] == "after_turn")
    assert ended == [(1, "next"), (2, "pending"), (3, "done")]
    assert [e["status"] for e in lines() if e["kind"] == "after_run_settled"] == [
        "pending", "done",
    ]  # fmt: skip
    assert [e["turn"] for e in lines() if e["kind"] == "before_turn"] == [1, 2, 3]
    assert kinds.index("after_tool") < kinds.index("after_request_opened")
    assert [e["tokens"] for e in lines() if e["kind"] == "after_model_call"] == [13, 13, 13]
    opened = next(e for e in lines() if e["kind"] == "after_request_opened")
    assert opened["request_kind"] == "tool_call"


TASK_BODIES = (
    "turns", "turn_budgets", "turn_failed", "turn_hooks", "turn_waits", "journal",
    "answers", "maintenance", "host/eager",
)  # fmt: skip


@pytest.mark.parametrize("module", TASK_BODIES)
def test_the_task_bodies_call_no_watcher_by_name(module):
    """Metrics, traces, announcements and Flower's progress are hooks: the turn's driver
    and the other task bodies import none of them."""
    source = (Path(__file__).parents[2] / "tasks" / f"{module}.py").read_text()
    tree = ast.parse(source)
    imported = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module is not None
    } | {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    watchers = {
        "tasks.observability.metrics",
        "tasks.observability.tracing",
        "tasks.broker.announce",
        "workers.events",
    }
    assert not imported & watchers
    assert "summary.split" not in source

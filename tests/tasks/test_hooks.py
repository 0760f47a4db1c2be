"""Hooks (`tasks.hooks`): each event reaches every hook that overrides its method, in order
(`after_*` in reverse), a failing hook is logged and skipped, hooks are named in settings and
checked, and no task body calls a watcher by name. Hooks seeing real runs, on an eager host and
on a worker: tests/durable/test_hooks.py."""

from __future__ import annotations

import ast
import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from relayq import Agent, AgentError
from tasks import Settings
from tasks.hooks import (
    BadHook,
    Hooks,
    RequestOpened,
    RunHooks,
    ToolRan,
    TurnEnded,
    TurnOutcome,
    TurnStarted,
    hooks_named,
)
from tests.durable import hook_agents
from tests.durable.hook_agents import Broken, Recorder, TokensPerTenant

START = TurnStarted("run_1", "a", 1, 1, None)
END = TurnEnded("run_1", "a", 1, TurnOutcome.DONE, 0.1)


async def test_before_hooks_run_in_order_and_after_hooks_in_reverse():
    seen: list[tuple[str, str, Any]] = []
    hooks = Hooks([Recorder("first", seen), Recorder("second", seen)])
    await hooks.emit(START)
    await hooks.emit(END, [Recorder("agent's", seen)])
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
        await hooks.emit(START)
    assert [(who, method) for who, method, _ in seen] == [("after it", "before_turn")]
    assert "hook Broken.before_turn failed (RuntimeError); skipped" in caplog.text
    assert "secret" not in caplog.text


async def test_a_hook_is_called_only_for_the_methods_it_overrides():
    seen: list[tuple[str, str, Any]] = []
    hooks = Hooks([RunHooks(), Recorder("x", seen)])
    await hooks.emit(RequestOpened("run_1", "a", "req_1", "tool_call"))  # left to the base
    await hooks.emit(ToolRan("run_1", "a", "call_1", False, 0.1))
    assert [(who, method) for who, method, _ in seen] == [("x", "after_tool")]


class Where(RunHooks):
    """Notes which thread each of its methods ran on; its plain method blocks until the
    loop has turned (at most 5 s), as a hook writing to a slow service would block."""

    def __init__(self, seen: list[tuple[str, int, bool]], turned: threading.Event) -> None:
        self.seen = seen
        self.turned = turned

    def before_turn(self, event: TurnStarted) -> None:
        released = self.turned.wait(timeout=5)
        self.seen.append(("sync", threading.get_ident(), released))

    async def after_turn(self, event: TurnEnded) -> None:
        self.seen.append(("async", threading.get_ident(), True))


class OwnWhere(Where):
    on_loop = True  # as relayq's own hooks


async def test_a_plain_hook_method_runs_on_a_thread_and_never_holds_the_loop():
    # Given a user's hook whose plain method blocks until the loop turns, and one of
    # relayq's own, and a task on the loop that says when it turned
    turned = threading.Event()
    seen: list[tuple[str, int, bool]] = []
    own: list[tuple[str, int, bool]] = []
    hooks = Hooks([Where(seen, turned), OwnWhere(own, turned)])
    loop_thread = threading.get_ident()

    async def turn() -> None:
        turned.set()

    turning = asyncio.create_task(turn())

    # When each event is emitted
    await hooks.emit(START)
    await hooks.emit(END)
    await turning

    # Then the user's plain method ran on another thread, and the loop turned while it
    # blocked; its async method, and relayq's own hook's plain one, ran on the loop
    assert seen[0][:2] != ("sync", loop_thread)
    assert seen[0][2], "the loop did not turn while the hook blocked"
    assert seen[1] == ("async", loop_thread, True)
    assert own == [("sync", loop_thread, True), ("async", loop_thread, True)]


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


TASK_BODIES = (
    "runner/turn/task", "runner/turn/budgets", "runner/turn/failed", "runner/turn/hooks",
    "runner/turn/waits", "runner/turn/journal", "runner/turn/answers", "runner/maintenance",
    "client/eager",
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

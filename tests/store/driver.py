"""The worker's own turn driver and journal (`tasks.runner.turn.task`,
`tasks.runner.turn.journal`) on the store, with no broker.

`run_turn` takes one stored turn through `drive_turn` (claim, the turn
journaled by `StoreJournal`, finish) with real toolkits and scripted models;
its messages stay in the outbox for the tests to read. Plus small readers of
the tables for asserting.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, TypeVar

from sqlalchemy import event
from sqlmodel import SQLModel, col, select

from relayq import (
    BuiltinsConfig,
    InProcessResponse,
    Tool,
    ToolContext,
    Toolkit,
    Usage,
    create_toolkit,
    define_tool,
)
from relayq.agents import Agent, OnExpiry
from relayq.loop import Turn
from relayq.model import Model, as_model
from relayq.relay import relay_tool
from store import (
    Claim,
    Database,
    LedgerRow,
    MessageRow,
    OutboxRow,
    RequestRow,
    RunRow,
    RunSpec,
    create_run,
    get_run,
)
from store.outbox import ANSWER_TASK, TURN_TASK
from tasks.runner.runtime import Runtime
from tasks.runner.turn.journal import StoreJournal
from tasks.runner.turn.task import drive_turn
from tasks.settings import Settings
from tests.relayq.scripted import Script, call, text

__all__ = [
    "ANSWER_TASK",
    "LEASE",
    "TURN_TASK",
    "journal",
    "halt_on_relay",
    "local_kit",
    "message_rows",
    "model_of",
    "outbox_rows",
    "relay_kit",
    "relay_turn",
    "request_rows",
    "run_turn",
    "snapshot",
    "start",
]

T = TypeVar("T", bound=SQLModel)

LEASE = timedelta(minutes=5)


class Unsent(Runtime):
    """A worker's runtime whose messages stay in the outbox, unsent (as when the sender
    dies before sending): the store's tests read them there, and need no broker."""

    async def publish(self, rows: list[OutboxRow]) -> None:
        pass


def runtime(db: Database, *agents: Agent) -> Unsent:
    settings = Settings.from_env({"RELAYQ_HOME": tempfile.gettempdir()})
    return Unsent(settings, db=db, agents={a.name: a for a in agents})


def journal(db: Database, claim: Claim) -> StoreJournal:
    """The worker's own journal of a turn held by `claim`."""
    return StoreJournal(runtime(db), claim)


def model_of(*replies: InProcessResponse | Callable[..., InProcessResponse]) -> Model:
    return as_model(Script(list(replies)))


def relay_turn(*pairs: tuple[str, str], usage: Usage | None = None) -> InProcessResponse:
    """A model reply calling each `(call_id, tool_name)` in order."""
    return InProcessResponse(tool_calls=[call(i, n, {"n": i}) for i, n in pairs], usage=usage)


async def relay_kit(*names: str, extra: list[Tool] | None = None) -> Toolkit:
    tools = [relay_tool(n, f"{n}, run by the host") for n in names]
    return await create_toolkit(builtins=BuiltinsConfig.off(), extra_tools=tools + (extra or []))


async def local_kit(
    name: str = "work", on_call: Callable[[ToolContext], None] | None = None
) -> Toolkit:
    """One local tool that answers `ran <call id>`, calling `on_call` first."""

    def run(args: dict[str, Any], ctx: ToolContext) -> str:
        if on_call is not None:
            on_call(ctx)
        return f"ran {ctx.call_id}"

    return await create_toolkit(
        builtins=BuiltinsConfig.off(), extra_tools=[define_tool(name, "local work", None, run)]
    )


def start(
    db: Database,
    *,
    run_id: str = "run_1",
    prompt: str = "go",
    conversation_id: str | None = None,
    agent: str = "agent",
    started_by: str | None = None,
) -> str:
    create_run(
        db,
        RunSpec(agent, started_by=started_by),
        run_id=run_id,
        prompt=prompt,
        conversation_id=conversation_id,
    )
    return run_id


async def run_turn(
    db: Database,
    run_id: str,
    toolkit: Toolkit,
    model: Model,
    *,
    request_ttl: timedelta | None = None,
    on_expiry: OnExpiry = "error",
) -> Turn:
    """Take one turn of the queued run as a worker takes it (`tasks.runner.turn.task.drive_turn`),
    with `toolkit`'s tools and `model` as its agent's."""
    agent = Agent(
        get_run(db, run_id).agent,
        model,
        tools=toolkit.tools,
        request_ttl=request_ttl,
        on_expiry=on_expiry,
        register=False,
    )
    rt = runtime(db, agent)
    outcome = await drive_turn(rt, None, run_id, get_run(db, run_id).version)
    assert outcome.turn is not None, f"run {run_id} took no turn: {outcome}"
    return outcome.turn


async def halt_on_relay(
    db: Database,
    *call_ids: str,
    run_id: str = "run_1",
    conversation_id: str | None = None,
    request_ttl: timedelta | None = None,
    on_expiry: OnExpiry = "error",
    final: str = "finished",
) -> tuple[Toolkit, Model, Turn]:
    """A run halted on one request carrying a relay call per id, in order.

    The model, called again, answers `final`.
    """
    kit = await relay_kit("lookup")
    model = model_of(relay_turn(*[(c, "lookup") for c in call_ids]), text(final))
    start(db, run_id=run_id, conversation_id=conversation_id)
    turn = await run_turn(db, run_id, kit, model, request_ttl=request_ttl, on_expiry=on_expiry)
    assert turn.status == "pending"
    assert turn.pending is not None
    return kit, model, turn


def _all(db: Database, table: type[T], *where: Any, order: Any = None) -> list[T]:
    query = select(table).where(*where)
    if order is not None:
        query = query.order_by(order)
    with db.read() as s:
        return list(s.exec(query))


def message_rows(db: Database, conversation_id: str = "run_1") -> list[MessageRow]:
    return _all(
        db, MessageRow, MessageRow.conversation_id == conversation_id, order=col(MessageRow.seq)
    )


def outbox_rows(db: Database, task: str | None = None) -> list[OutboxRow]:
    where = [] if task is None else [OutboxRow.task == task]
    return _all(db, OutboxRow, *where, order=col(OutboxRow.id))


def request_rows(db: Database, run_id: str = "run_1") -> list[RequestRow]:
    return _all(db, RequestRow, RequestRow.run_id == run_id)


def snapshot(db: Database) -> dict[str, list[dict[str, Any]]]:
    """Every row of every table, to show that something changed nothing."""
    tables: dict[str, tuple[type[SQLModel], Any]] = {
        "runs": (RunRow, col(RunRow.id)),
        "messages": (MessageRow, col(MessageRow.seq)),
        "requests": (RequestRow, col(RequestRow.id)),
        "ledger": (LedgerRow, col(LedgerRow.call_id)),
        "outbox": (OutboxRow, col(OutboxRow.id)),
    }
    return {
        name: [row.model_dump() for row in _all(db, table, order=order)]
        for name, (table, order) in tables.items()
    }


@contextmanager
def statements(db: Database) -> Iterator[list[str]]:
    """The SQL statements run while open (an executemany counts once)."""
    seen: list[str] = []

    def note(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    for engine in db.engines:
        event.listen(engine, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        for engine in db.engines:
            event.remove(engine, "before_cursor_execute", note)

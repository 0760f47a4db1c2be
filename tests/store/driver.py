"""A worker in miniature: runs one stored turn the way a durable worker does.

claim_turn -> take_turn (journaling to the store) -> finish_turn, with real
toolkits and scripted models. Plus small readers of the tables for asserting.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from sqlmodel import SQLModel, col, select

from relayq import (
    BuiltinsConfig,
    InProcessResponse,
    Request,
    Tool,
    ToolContext,
    Toolkit,
    ToolResult,
    Usage,
    create_toolkit,
    define_tool,
)
from relayq._model import Model, as_model
from relayq.loop import Journal, Turn, take_turn
from relayq.relay import relay_tool
from store import (
    Claim,
    Database,
    LedgerRow,
    MessageRow,
    OutboxRow,
    RequestRow,
    RunRow,
    claim_turn,
    create_run,
    finish_turn,
    get_run,
    ledger_get,
    ledger_put,
    ledger_start,
    save_reply,
    transcript,
)
from store.outbox import ANSWER_TASK, TURN_TASK
from tests.relayq.scripted import Script, call, text

__all__ = [
    "ANSWER_TASK",
    "LEASE",
    "TURN_TASK",
    "StoreJournal",
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
DIGEST = "tools-digest"


class StoreJournal(Journal):
    """What the durable worker journals: the reply before tools, tool outcomes in the ledger."""

    def __init__(self, db: Database, claim: Claim) -> None:
        self.db = db
        self.claim = claim

    async def model_replied(self, messages: list[dict[str, Any]]) -> None:
        save_reply(self.db, self.claim, messages)

    async def recorded(self, at: int, call_id: str, attempt: str) -> ToolResult | Request | None:
        return ledger_get(self.db, self.claim.run_id, at, call_id, attempt)

    async def starting(self, at: int, call_id: str, attempt: str) -> int:
        return ledger_start(self.db, self.claim.run_id, at, call_id, attempt)

    async def record(
        self, at: int, call_id: str, attempt: str, outcome: ToolResult | Request
    ) -> None:
        ledger_put(self.db, self.claim.run_id, at, call_id, attempt, outcome)


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
) -> str:
    create_run(db, run_id=run_id, agent=agent, prompt=prompt, conversation_id=conversation_id)
    return run_id


async def run_turn(
    db: Database,
    run_id: str,
    toolkit: Toolkit,
    model: Model,
    *,
    task_id: str | None = None,
    request_ttl: timedelta | None = None,
    on_expiry: str = "error",
) -> Turn:
    """Claim the queued run at its current version, take one turn, persist it."""
    claim = claim_turn(db, run_id, get_run(db, run_id).version, task_id=task_id, lease=LEASE)
    assert claim is not None, f"run {run_id} could not be claimed"
    before = transcript(db, claim.conversation_id)
    turn = await take_turn(before, toolkit, model, run_id=run_id, journal=StoreJournal(db, claim))
    finish_turn(
        db,
        claim,
        before,
        turn,
        tools_digest=DIGEST,
        request_ttl=request_ttl,
        on_expiry=on_expiry,
    )
    return turn


async def halt_on_relay(
    db: Database,
    *call_ids: str,
    run_id: str = "run_1",
    conversation_id: str | None = None,
    request_ttl: timedelta | None = None,
    on_expiry: str = "error",
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

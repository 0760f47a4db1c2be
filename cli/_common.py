"""What every command shares: the request filter and budget options, relayq's errors as
one line (`user_errors`), the client (`run_with_client`), and an age read from an option.

Importable from here too, as the commands do: one-line errors and the console
(`cli._output`), the settings checked up front (`cli._settings`), and the checks of the
broker and the workers that keep an operator from guessing (`cli._worker_checks`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Annotated, TypeVar

import typer
from kombu.exceptions import OperationalError as BrokerError
from sqlalchemy.exc import OperationalError as DatabaseError

from cli._output import EXIT_FAILED, console, fail, warn
from cli._settings import (
    broker_shown,
    database_shown,
    known_agent,
    load_agent_modules,
    settings,
)
from cli._worker_checks import (
    WorkerWatch,
    broker_down,
    check_broker,
    no_worker_line,
    unsent_line,
    warn_if_no_worker,
    worker_command,
)
from relayq import Budget, RelayqError
from store import Database, OutboxRow, StoreUnavailable
from store.paging import BadQuery
from store.request_terms import age_of as read_age
from tasks.client.client import DurableClient
from tasks.settings import Settings

__all__ = [
    "EXIT_FAILED",
    "AgentFilter",
    "GroupFilter",
    "OlderThanFilter",
    "SearchFilter",
    "ToolFilter",
    "WorkerWatch",
    "age_of",
    "broker_down",
    "broker_shown",
    "check_broker",
    "check_database",
    "console",
    "database_shown",
    "fail",
    "known_agent",
    "load_agent_modules",
    "no_worker_line",
    "run_with_client",
    "settings",
    "unsent_line",
    "user_errors",
    "warn",
    "warn_if_no_worker",
    "worker_command",
]

T = TypeVar("T")

# The request filters `pending` and `bulk` share.
AgentFilter = Annotated[str | None, typer.Option(help="Only this agent's requests.")]
ToolFilter = Annotated[str | None, typer.Option(help="Only requests about this tool.")]
GroupFilter = Annotated[
    str | None, typer.Option(help="Only requests whose approver groups name this group.")
]
SearchFilter = Annotated[
    str | None,
    typer.Option("--search", "-q", help="Text in the prompt or the arguments, any case."),
]
OlderThanFilter = Annotated[
    str | None, typer.Option(help="Only requests older than this: 90s, 15m, 2h, 3d, 1w.")
]

MaxTokens = Annotated[
    int | None, typer.Option("--max-tokens", help="The most tokens the run may spend.")
]
MaxCost = Annotated[
    float | None,
    typer.Option("--max-cost", help="The most the run may cost, in the provider's prices' unit."),
]
OverBudget = Annotated[
    str,
    typer.Option(
        "--over-budget",
        help="Past the budget: ask (a `budget` request a person decides) or end (over_budget).",
    ),
]


def budget_of(tokens: int | None, cost: float | None, over: str, *, what: str) -> Budget | None:
    """A budget from the command's options (None without a limit); a bad one is one line."""
    if tokens is None and cost is None:
        return None
    if over not in ("ask", "end"):
        fail(f"--over-budget is ask or end, not {over!r}")
    for name, value in (("tokens", tokens), ("cost", cost)):
        if value is not None and value <= 0:
            fail(f"{what} {name} must be more than 0, not {value}")
    return Budget(tokens=tokens, cost=cost, on_exceed="ask" if over == "ask" else "end")


@contextmanager
def user_errors(current: Settings | None = None) -> Iterator[None]:
    """Turn relayq's errors, and an unreachable store or broker, into one line on stderr.

    With `current`, the line names the database or broker by its variable and URL
    (its password hidden).
    """
    try:
        yield
    except StoreUnavailable as exc:
        where = exc.address if current is None else database_shown(current.database_url)
        fail(f"cannot use the database at {where} (RELAYQ_DATABASE_URL): {exc.reason}")
    except RelayqError as exc:
        fail(str(exc))
    except DatabaseError as exc:
        where = "" if current is None else f" at {database_shown(current.database_url)}"
        fail(f"cannot use the database{where} (RELAYQ_DATABASE_URL): {exc.orig or exc}")
    except BrokerError as exc:
        fail(
            broker_down(current, exc)
            if current is not None
            else f"cannot reach the broker (RELAYQ_BROKER_URL): {exc}"
        )


def check_database(current: Settings) -> None:
    """Connect to the store once; one line naming RELAYQ_DATABASE_URL if that fails.

    For the processes that would otherwise fail later, in a traceback (`worker`, `api`).
    """
    with user_errors(current):
        db = Database(current.database_url)
        try:
            with db.engine.connect() as conn:
                conn.exec_driver_sql("SELECT 1")
        finally:
            db.dispose()


def run_with_client(
    work: Callable[[DurableClient], Awaitable[T]], current: Settings | None = None
) -> T:
    """Run `work` with a client on the configured store and broker, errors as one line."""
    current = current or settings()
    with user_errors(current):
        client = DurableClient(settings=current, on_unsent=_unsent_warning(current))
        try:
            return asyncio.run(_call(work, client))
        finally:
            client.close()


async def _call(work: Callable[[DurableClient], Awaitable[T]], client: DurableClient) -> T:
    return await work(client)


def _unsent_warning(current: Settings) -> Callable[[list[OutboxRow]], None]:
    """The client's `on_unsent` for a command: one `relayq: warning:` line, the first time
    a change it stored could not be sent, in place of a log line for each message."""
    said = False

    def say(rows: list[OutboxRow]) -> None:
        nonlocal said
        if not said:
            said = True
            warn(unsent_line(current, rows))

    return say


def age_of(text: str, flag: str = "--older-than") -> timedelta:
    """`90s`, `15m`, `2h`, `3d`, `1w`: the store's one reading of an age (`store.age_of`),
    a one-line error naming `flag` if it is none (or over a century)."""
    try:
        return read_age(text, flag)
    except BadQuery as exc:
        fail(str(exc))

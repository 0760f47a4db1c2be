"""What every command shares: one-line errors, the client, agent names, the consoles."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Annotated, NoReturn, TypeVar

import typer
from kombu.exceptions import OperationalError as BrokerError
from rich.console import Console
from sqlalchemy.exc import OperationalError as DatabaseError

from relayq import RelayqError
from relayq.agents import load_agents, registered_agents
from tasks.client import DurableClient
from tasks.settings import Settings

__all__ = [
    "EXIT_FAILED",
    "AgentFilter",
    "GroupFilter",
    "OlderThanFilter",
    "SearchFilter",
    "ToolFilter",
    "age_of",
    "console",
    "fail",
    "known_agent",
    "run_with_client",
    "settings",
    "user_errors",
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

# Exit status of a command whose run ended badly (failed, cancelled, incomplete, timed out)
# or whose input was refused. Click keeps 2 for usage errors.
EXIT_FAILED = 1

# Wide enough for ids and a few columns when stdout is a pipe or a file.
PIPE_WIDTH = 160


def console() -> Console:
    """A console on the current stdout (CliRunner swaps it per invocation).

    Piped into grep or a file, tables keep their ids whole rather than fitting 80 columns.
    """
    out = Console(highlight=False, soft_wrap=True)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out.width = PIPE_WIDTH
    return out


def fail(message: str) -> NoReturn:
    """Print one `relayq: error: ...` line on stderr and exit non-zero."""
    line = " ".join(str(message).split())  # one line, whatever the message held
    typer.echo(f"relayq: error: {line}", err=True)
    raise typer.Exit(EXIT_FAILED)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn relayq's errors, and an unreachable store, into one line on stderr."""
    try:
        yield
    except RelayqError as exc:
        fail(str(exc))
    except DatabaseError as exc:
        fail(f"cannot use the database: {exc.orig or exc}")
    except BrokerError as exc:
        fail(f"cannot reach the broker: {exc}")


def settings() -> Settings:
    try:
        return Settings.from_env()
    except ValueError as exc:
        fail(str(exc))


def known_agent(name: str, current: Settings) -> str:
    """`name` if an agent module of RELAYQ_AGENTS registers it; else a one-line error.

    A run of an agent no worker knows would only fail later, on the worker.
    """
    if not current.agents:
        fail(
            f"cannot check agent {name!r}: RELAYQ_AGENTS is not set; set it to the module(s) "
            "that define your agents, as for the workers (e.g. RELAYQ_AGENTS=relayq.demo)"
        )
    with user_errors():
        load_agents(current.agents)
    known = registered_agents()
    if name not in known:
        listed = ", ".join(sorted(known)) or "none"
        fail(f"unknown agent {name!r} (RELAYQ_AGENTS={current.agents} registers: {listed})")
    return name


def run_with_client(
    work: Callable[[DurableClient], Awaitable[T]], current: Settings | None = None
) -> T:
    """Run `work` with a client on the configured store and broker, errors as one line."""
    current = current or settings()
    with user_errors():
        client = DurableClient(settings=current)
        try:
            return asyncio.run(_call(work, client))
        finally:
            client.close()


async def _call(work: Callable[[DurableClient], Awaitable[T]], client: DurableClient) -> T:
    return await work(client)


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def age_of(text: str) -> timedelta:
    """`90s`, `15m`, `2h`, `3d`, `1w`: the units `relayq pending` shows ages in."""
    found = re.fullmatch(r"\s*(\d+)\s*([smhdw])\s*", text)
    if found is None:
        fail(f"cannot read {text!r} as an age; write a number and a unit: 90s, 15m, 2h, 3d, 1w")
    return timedelta(seconds=int(found.group(1)) * _UNITS[found.group(2)])

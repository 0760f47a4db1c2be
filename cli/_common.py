"""What every command shares: one-line errors, the client, agent names, the consoles.

And what keeps an operator from guessing: settings checked up front (a bad
value is one `relayq: error:` line naming its variable, a URL shown with its
password hidden), the broker checked before a run is started, and a warning,
with the command that starts one, when no worker consumes a run's queue
(`warn_if_no_worker`, `WorkerWatch`), or when the broker does not take the
messages of a change already stored (`unsent_line`: it goes on once the broker
is back).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from datetime import timedelta
from typing import Annotated, NoReturn, TypeVar

import typer
from kombu.exceptions import OperationalError as BrokerError
from kombu.transport import resolve_transport
from kombu.utils.url import maybe_sanitize_url, parse_url
from rich.console import Console
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError
from sqlalchemy.exc import OperationalError as DatabaseError

from cli._workers import Serving, ping_broker, queue_of, workers_on
from relayq import Budget, RelayqError
from relayq.agents import AgentError, load_agents, registered_agents
from store import Database, OutboxRow, StoreUnavailable
from store.outbox import ANSWER_TASK, TURN_TASK
from store.paging import BadQuery
from store.requests import age_of as read_age
from tasks.host.client import DurableClient
from tasks.settings import QUEUES, Settings

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


def fail(message: str) -> NoReturn:
    """Print one `relayq: error: ...` line on stderr and exit non-zero."""
    line = " ".join(str(message).split())  # one line, whatever the message held
    typer.echo(f"relayq: error: {line}", err=True)
    raise typer.Exit(EXIT_FAILED)


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


# --- configuration: a bad value is one line naming its variable, never a traceback --------------


def settings() -> Settings:
    """The settings from the environment, their URLs checked for what can be told offline.

    Each refusal is one `relayq: error:` line naming the variable; a URL is shown
    with its password hidden.
    """
    try:
        current = Settings.from_env()
    except ValueError as exc:
        fail(str(exc))
    _check_database_url(current.database_url)
    if not current.embedded_broker:
        _check_broker_url(current.broker_url)
    return current


_DATABASE_EXAMPLE = "sqlite:///PATH or postgresql+psycopg://USER:PASSWORD@HOST:5432/NAME"
_BROKER_EXAMPLE = "redis://HOST:6379/0, or leave it unset for the embedded Redis"


def _check_database_url(url: str) -> None:
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        # Not quoted: a URL that does not parse may show its password in the clear.
        fail(f"RELAYQ_DATABASE_URL is not a database URL; write {_DATABASE_EXAMPLE}")
    shown = database_shown(url)
    try:
        dialect = parsed.get_dialect()
    except NoSuchModuleError:
        fail(f"RELAYQ_DATABASE_URL ({shown}) names a database relayq cannot use; "
             f"write {_DATABASE_EXAMPLE}")  # fmt: skip
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        fail(f"RELAYQ_DATABASE_URL ({shown}) needs a driver that is not installed ({exc}); "
             f"relayq ships psycopg 3: write {_DATABASE_EXAMPLE}")  # fmt: skip


def _check_broker_url(url: str) -> None:
    scheme, sep, _ = url.partition("://")
    if not sep:
        fail(f"RELAYQ_BROKER_URL is not a URL; write {_BROKER_EXAMPLE}")
    try:
        for each in url.split(";"):  # sentinel://h1:26379;sentinel://h2:26379 names several
            parse_url(each)
    except ValueError as exc:  # not quoted, nor shown: its password may be in the clear
        fail(f"RELAYQ_BROKER_URL does not parse: {exc}; write {_BROKER_EXAMPLE}")
    shown = _broker_url_shown(url)
    try:
        # kombu's names: `redis+socket` is the redis transport on a Unix socket.
        resolve_transport(scheme.partition("+")[0])
    except KeyError:
        fail(f"RELAYQ_BROKER_URL ({shown}) names no broker kombu knows; write {_BROKER_EXAMPLE}")
    except ImportError as exc:
        fail(f"RELAYQ_BROKER_URL ({shown}) needs a library that is not installed ({exc})")


def database_shown(url: str) -> str:
    """The database URL with its password hidden."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return "(a URL that does not parse)"


def broker_shown(current: Settings) -> str:
    """The broker as a person reads it: its URL with the password hidden."""
    if current.embedded_broker:
        return f"the embedded Redis on {current.socket_path}"
    return _broker_url_shown(current.broker_url)


def _broker_url_shown(url: str) -> str:
    try:
        return str(maybe_sanitize_url(url))
    except ValueError:
        return "(a URL that does not parse)"


def load_agent_modules(current: Settings) -> None:
    """Import RELAYQ_AGENTS's modules and check each agent fits these settings; one line if not."""
    try:
        load_agents(current.agents)
    except AgentError as exc:
        fail(f"RELAYQ_AGENTS: {exc}")
    except Exception as exc:  # a module that raises on import: where, not a traceback
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        fail(
            f"RELAYQ_AGENTS ({current.agents}): importing it raised {type(exc).__name__}: "
            f"{exc} ({frame.filename}, line {frame.lineno})"
        )
    for agent in registered_agents().values():
        try:
            current.check_agent(agent)
        except AgentError as exc:
            fail(str(exc))


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


def known_agent(name: str, current: Settings) -> str:
    """`name` if an agent module of RELAYQ_AGENTS registers it; else a one-line error.

    A run of an agent no worker knows would only fail later, on the worker.
    """
    if not current.agents:
        fail(
            f"cannot check agent {name!r}: RELAYQ_AGENTS is not set; set it to the module(s) "
            "that define your agents, as for the workers (e.g. RELAYQ_AGENTS=relayq.demo)"
        )
    load_agent_modules(current)
    known = registered_agents()
    if name not in known:
        listed = ", ".join(sorted(known)) or "none"
        fail(f"unknown agent {name!r} (RELAYQ_AGENTS={current.agents} registers: {listed})")
    return name


# --- the broker and the workers: never left waiting in silence ---------------------------------

# What reaching the broker raises when it cannot: kombu's error, a socket's, or a value
# the transport refuses only once it connects (`redis://host/abc`: no such db number).
_BROKER_DOWN = (BrokerError, OSError, ValueError)


def check_broker(current: Settings) -> None:
    """Return once the broker answers (within seconds); else one line naming it, and exit 1."""
    try:
        ping_broker(current)
    except _BROKER_DOWN as exc:
        fail(broker_down(current, exc))


def broker_down(current: Settings, exc: BaseException) -> str:
    """What to say when the broker does not answer: which one, and what to do."""
    if current.embedded_broker:
        return (
            f"the embedded broker is not running (RELAYQ_BROKER_URL is unset, and nothing "
            f"answers on {current.socket_path}); a worker starts it: {worker_command(current)}"
        )
    return f"cannot reach the broker at {broker_shown(current)} (RELAYQ_BROKER_URL): {exc}"


def worker_command(current: Settings, queue: str | None = None, *, alone: bool = True) -> str:
    """The command that starts a worker for `queue` with these settings' agents.

    An agent's own queue needs naming (`-Q`); when no other worker runs (`alone`),
    the new one takes relayq's queues too, for the answers and the sweeps.
    """
    words = ["relayq", "worker"]
    if current.agents:
        words += ["--agents", current.agents]
    if queue is not None and queue not in QUEUES:
        words += ["-Q", ",".join([queue, *QUEUES]) if alone else queue]
    return shlex.join(words)


def no_worker_line(agent: str, serving: Serving, current: Settings) -> str | None:
    """The warning for a queue no worker consumes; None when one does."""
    if serving.served:
        return None
    if serving.others and serving.batches:
        count = len(serving.others)
        return (
            f"{count} worker{'s' if count > 1 else ''} running, none taking the turns of the "
            f"batches of agent {agent!r} (queue {serving.queue}; RELAYQ_WORKER_BATCHES=skip "
            f"keeps a worker off them); start one: "
            f"{worker_command(current, serving.queue, alone=False)}"
        )
    if serving.others:
        count = len(serving.others)
        return (
            f"{count} worker{'s' if count > 1 else ''} running, none consuming queue "
            f"{serving.queue}, where the turns of agent {agent!r} go; start one: "
            f"{worker_command(current, serving.queue, alone=False)}"
        )
    broker = broker_shown(current)
    if serving.unsure:
        count = serving.beating
        return (
            f"no worker answered on {broker} (key prefix {current.key_prefix}), though "
            f"{count} worker process{'es' if count > 1 else ''} beat in the store: busy, or "
            "using another RELAYQ_BROKER_URL or RELAYQ_KEY_PREFIX than this command"
        )
    return (
        f"no worker is running on {broker} to take the turns of agent {agent!r} (queue "
        f"{serving.queue}); start one: {worker_command(current, serving.queue)}"
    )


def warn_if_no_worker(
    agent: str, current: Settings, *, db: Database | None = None, batches: bool = False
) -> bool:
    """Ask the workers, in about a second, whether one consumes `agent`'s queue (with
    `batches`: whether one takes the turns of its batches); True if so.

    If none does, say so on stderr in one `relayq: warning:` line with the
    command that starts one, and return False; the caller goes on waiting. With
    `db`, a worker that beats in the store but did not answer is told apart from
    none. A broker that does not answer is a `relayq: error:` line and exit 1.
    The agent's module must be loaded (`known_agent`).
    """
    try:
        serving = workers_on(current, queue_of(agent), db=db, batches=batches)
    except _BROKER_DOWN as exc:
        fail(broker_down(current, exc))
    line = no_worker_line(agent, serving, current)
    if line is not None:
        warn(line)
    return serving.served


def warn(message: str) -> None:
    """One `relayq: warning: ...` line on stderr."""
    typer.echo(f"relayq: warning: {' '.join(message.split())}", err=True)


class WorkerWatch:
    """While a run waits in its queue, checks every few seconds that a worker consumes it.

    `poll(status)` is cheap and never blocks: the check (a broadcast taking a
    second) runs on a thread of its own. The first comes once the run has waited
    `first_after` seconds, so a run a worker takes at once costs nothing. When no
    worker consumes the queue, one warning says so (a worker that beats in the
    store but did not answer only after `unsure_after` seconds, as it may just be
    busy); once a worker takes the run, one line says that too.
    """

    def __init__(
        self,
        agent: str,
        current: Settings,
        db: Database | None = None,
        *,
        first_after: float = 1.0,
        every: float = 3.0,
        unsure_after: float = 5.0,
    ) -> None:
        self.agent = agent
        self.current = current
        self.db = db
        self.queue = queue_of(agent)
        self.first_after, self.every, self.unsure_after = first_after, every, unsure_after
        self.warned: str | None = None
        """The last warning given, until a worker took the run."""
        self._unserved: Serving | None = None
        self._check: Future[Serving] | None = None
        self._queued_since: float | None = None
        self._next = 0.0

    def poll(self, status: str) -> None:
        """Note the run's status; warn or fail (the broker is down) as the last check found."""
        now = time.monotonic()
        if status != "queued":
            if self.warned is not None:
                typer.echo("relayq: a worker took the run", err=True)
                self.warned = None
            self._queued_since = None
            return
        if self._queued_since is None:
            self._queued_since, self._next = now, now + self.first_after
        if self._check is not None and self._check.done():
            self._found(self._check, waited=now - self._queued_since)
            self._check, self._next = None, now + self.every
        if self._check is None and now >= self._next:
            self._check = self._start_check()

    def _start_check(self) -> Future[Serving]:
        # A daemon thread: a check still in flight when the command ends holds nothing up.
        found: Future[Serving] = Future()

        def check() -> None:
            try:
                found.set_result(workers_on(self.current, self.queue, db=self.db))
            except BaseException as exc:
                found.set_exception(exc)

        threading.Thread(target=check, name="relayq-worker-check", daemon=True).start()
        return found

    def _found(self, check: Future[Serving], *, waited: float) -> None:
        try:
            serving = check.result()
        except _BROKER_DOWN as exc:
            fail(broker_down(self.current, exc))
        line = no_worker_line(self.agent, serving, self.current)
        if line is None or (serving.unsure and waited < self.unsure_after):
            return
        if line != self.warned:
            warn(line)
            self.warned = line
            self._unserved = serving

    def hint(self) -> str:
        """For the line that gives up waiting: why the run may not have started."""
        serving = self._unserved
        if self.warned is None or serving is None:
            return ""
        if serving.unsure:
            return f"; no worker answered for queue {serving.queue}"
        command = worker_command(self.current, serving.queue, alone=not serving.others)
        return f"; no worker consumes queue {serving.queue} (start one: {command})"


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


def unsent_line(current: Settings, rows: list[OutboxRow]) -> str:
    """What to say when the broker did not take the messages of a change that is stored:
    the outbox keeps them, and a worker's sweep sends them once the broker is back."""
    where = broker_shown(current)
    if not current.embedded_broker:
        where = f"the broker at {where}"
    tasks = {row.task for row in rows}
    many = len(rows) > 1
    if tasks == {ANSWER_TASK}:
        stored = (
            "the answers are stored and reach their runs"
            if many
            else "the answer is stored and reaches the run"
        )
    elif tasks == {TURN_TASK}:
        stored = "the runs are stored and start" if many else "the run is stored and starts"
    else:
        stored = "the change is stored and goes on"
    return f"{where} is not answering: {stored} once the broker is back"


def age_of(text: str) -> timedelta:
    """`90s`, `15m`, `2h`, `3d`, `1w`: the store's one reading of an age (`store.age_of`)."""
    try:
        return read_age(text)
    except BadQuery as exc:
        fail(str(exc))

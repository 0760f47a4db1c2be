"""The broker and the workers: a command never leaves an operator waiting in silence.

The broker is checked before a run is started (`check_broker`); when no worker
consumes a run's queue, a warning says so with the command that starts one
(`warn_if_no_worker`, `WorkerWatch`); and when the broker does not take the
messages of a change already stored, a line says it goes on once the broker is
back (`unsent_line`).
"""

from __future__ import annotations

import shlex
import threading
import time
from concurrent.futures import Future

import typer
from kombu.exceptions import OperationalError as BrokerError

from cli._output import fail, warn
from cli._settings import broker_shown
from cli._workers import Serving, ping_broker, queue_of, workers_on
from store import Database, OutboxRow
from store.outbox import ANSWER_TASK, TURN_TASK
from tasks.settings import QUEUES, Settings

__all__ = [
    "WorkerWatch",
    "broker_down",
    "check_broker",
    "no_worker_line",
    "unsent_line",
    "warn_if_no_worker",
    "worker_command",
]

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

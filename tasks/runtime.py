"""What one worker process holds: the store, its agents, an event loop and a few I/O threads.

Turns are coroutines (`relayq.loop.take_turn`) on one event loop per process,
so hundreds of model calls wait at once without a thread each. The store's
calls are blocking: on SQLite they run inline when its write lock is free
(each takes a fraction of a millisecond), and on an I/O thread when another
process holds it; on PostgreSQL always in a thread pool. Nothing that waits
on the store waits on the loop: not the heartbeat (`tasks.heartbeat`), not a
store call stuck behind a long transaction.
A task body waits for its coroutine (`Runtime.wait`): under a classic pool
it runs it on the loop; under the asyncio pool (`workers.aio`) it hands it
to the pool and sleeps in its greenlet until the pool wakes it with the outcome.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, ParamSpec, TypeVar

from celery import Celery, current_app
from greenlet import getcurrent  # type: ignore[import-untyped]

from relayq.agents import Agent, UnknownAgent, load_agents, registered_agents
from relayq.retry import backoff
from store import (
    Database,
    StoreUnavailable,
    forget_worker,
    migrate,
    sweep,
)
from store.batch_queues import active_batch_queues
from store.errors import safe_text
from store.maintenance import SweepReport
from store.outbox import ANSWER_QUEUE, TURN_QUEUE, sent_at
from store.retention import CHUNK as RETENTION_CHUNK
from store.retention import (
    DECISION_CHUNK,
    EVENT_CHUNK,
    purge_decisions,
    purge_events,
    purge_finished,
)
from store.workers import HOSTNAME
from tasks.alone import AloneProcesses
from tasks.broker.announce import RunAnnouncer
from tasks.broker.dispatch import BrokerDispatch, Dispatch
from tasks.broker.peek import QueuePeek
from tasks.broker.publish import sender_app
from tasks.heartbeat import Heartbeat
from tasks.hooks import Hooks, RunHooks, hooks_named
from tasks.loopwatch import LoopWatch
from tasks.observability.metrics import Metrics, observe_store_calls
from tasks.observability.tracing import Tracing
from tasks.settings import Settings
from tasks.storeio import StoreCalls
from tasks.tool_threads import ToolThreads
from tasks.transcripts import Transcripts
from tasks.webhooks.sender import WebhookSender

__all__ = ["EXIT_RETIRED", "LoopThread", "Runtime", "Working", "defer", "deferring"]

T = TypeVar("T")
log = logging.getLogger(__name__)

EXIT_RETIRED = 75
"""The exit status of a worker that retired (`Runtime.retire`): start me anew (EX_TEMPFAIL)."""


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


P = ParamSpec("P")

_local = threading.local()


@contextmanager
def deferring() -> Iterator[list[Coroutine[Any, Any, Any]]]:
    """While open, `defer` hands coroutines to the caller (the asyncio pool) instead."""
    _local.slot = []
    try:
        yield _local.slot
    finally:
        _local.slot = None


def defer(work: Coroutine[Any, Any, Any]) -> bool:
    """Leave `work` for the asyncio pool to run; False when no such pool is calling."""
    slot: list[Coroutine[Any, Any, Any]] | None = getattr(_local, "slot", None)
    if slot is None:
        return False
    slot.append(work)
    return True


class LoopThread:
    """An asyncio loop in a daemon thread: one per process (`shared()`)."""

    _shared: LoopThread | None = None
    _pid: int | None = None
    _lock = threading.Lock()

    def __init__(self, io_threads: int = 8, tools: ToolThreads | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.executor = ThreadPoolExecutor(io_threads, thread_name_prefix="relayq-io")
        """The store's threads (`Runtime.io`)."""
        self.tools = tools or ToolThreads(32, stuck_limit=8)
        """Every other thread's work, sync tools' above all (`asyncio.to_thread`): stuck
        ones never keep a store call waiting (`tasks.tool_threads`)."""
        self.loop.set_default_executor(self.tools)
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="relayq-loop", daemon=True
        )
        self._thread.start()

    @classmethod
    def shared(
        cls, io_threads: int = 8, tools: Callable[[], ToolThreads] | None = None
    ) -> LoopThread:
        """The process's loop; made with these threads when none runs here yet."""
        with cls._lock:
            if cls._shared is None or cls._pid != os.getpid():
                cls._shared = LoopThread(io_threads, tools() if tools is not None else None)
                cls._pid = os.getpid()
            return cls._shared

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coro` on the loop and wait for it (from any thread but the loop's)."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()
            raise


class Working:
    """The runs a task of this process is claiming or holding right now, counted per run
    (a duplicate message of a run may be in hand beside the one that holds it).

    Entered before the claim is asked for, left after the turn's last write: a claim
    of this process on a run not in here is held by no task, and the sweeper frees it.
    """

    def __init__(self) -> None:
        self._runs: Counter[str] = Counter()
        self._lock = threading.Lock()  # the sweeper reads it from an I/O thread

    @contextmanager
    def on(self, run_id: str) -> Iterator[None]:
        with self._lock:
            self._runs[run_id] += 1
        try:
            yield
        finally:
            with self._lock:
                self._runs[run_id] -= 1
                if self._runs[run_id] <= 0:
                    del self._runs[run_id]

    def runs(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._runs)


STORE_RETRY_MAX = 2.0
"""Seconds between tries of a store call that met an outage, at most: a run moves on
within that of the store's return."""


class Runtime:
    """The process's store, agents, loop and sender; built once per process."""

    _current: Runtime | None = None
    _pid: int | None = None
    _lock = threading.Lock()

    def __init__(
        self,
        settings: Settings,
        *,
        agents: Mapping[str, Agent] | None = None,
        db: Database | None = None,
        hooks: Iterable[RunHooks] = (),
    ) -> None:
        self.settings = settings
        if db is None:
            db = Database(settings.database_url)
            migrate(db)
        self.db = db
        if settings.agents:
            load_agents(settings.agents)
        self.agents: Mapping[str, Agent] = agents if agents is not None else registered_agents()
        self._loop: LoopThread | None = None
        self.inline_store = self.db.is_sqlite
        self._store = StoreCalls(inline=self.inline_store, executor=self._store_threads)
        self.app: Celery | None = None
        """The worker's app once a task has run here; else a sender is built on demand."""
        self._sender: Celery | None = None
        self.dispatch = self._make_dispatch()
        """Where the messages of this process's changes go (`tasks.broker.dispatch`)."""
        self.retiring: str | None = None
        """Why this worker retires (`retire`), once it does."""
        self.on_retire: list[Callable[[str], None]] = []
        """Told once when the worker retires: the worker's process stops consuming."""
        self._retire_lock = threading.Lock()
        self.working = Working()
        """Runs a task of this process is claiming or holding (`Working`)."""
        self.transcripts = Transcripts()
        """Transcripts of the runs whose next turn this process queued (`tasks.transcripts`)."""
        self.worker_id = f"{HOSTNAME}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        """This process, as its claims name it; they last while its heartbeat does."""
        self._peek: QueuePeek | None = None
        self._background = False
        self.loopwatch: LoopWatch | None = None
        """The watch on this process's loop, once its background work runs."""
        self._outage_since: float | None = None
        self.alone: AloneProcesses | None = None
        """Where this process runs a turn that must run alone, when it runs several turns
        at once (the asyncio pool's `workers.alone`); None: it runs it itself."""
        self.heartbeat = Heartbeat(
            self.db,
            self.worker_id,
            every=settings.recovery.heartbeat_every.total_seconds(),
            timeout=settings.recovery.worker_timeout.total_seconds(),
        )
        self.hooks = Hooks(
            [
                Metrics(),
                Tracing(self.db, self.io, self.patiently),
                *hooks,
                *hooks_named(settings.hooks),
            ]
        )
        """What watches the runs' work (`tasks.hooks`): relayq's metrics and traces, the
        caller's `hooks`, then those `RELAYQ_HOOKS` names."""
        observe_store_calls(self.db)

    @property
    def runs_alone(self) -> bool:
        """This process runs one turn at a time (a prefork pool's child): its death is that
        turn's doing."""
        return self.settings.worker.pool == "prefork"

    def enter(self, what: str) -> None:
        """On the loop: what the current task does, named in a stall's log (`LoopWatch.enter`)."""
        if self.loopwatch is not None:
            self.loopwatch.enter(what)

    def leave(self) -> None:
        if self.loopwatch is not None:
            self.loopwatch.leave()

    @contextmanager
    def doing(self, what: str) -> Iterator[None]:
        """`enter` for the block (`LoopWatch.doing`)."""
        if self.loopwatch is None:
            yield
            return
        with self.loopwatch.doing(what):
            yield

    def _make_dispatch(self) -> Dispatch:
        return BrokerDispatch(lambda: self.sender, self.db, self.io)

    @property
    def loop(self) -> LoopThread:
        """The process's event loop in its thread, started when first needed."""
        if self._loop is None:
            # SQLite takes one writer at a time: more threads would only queue on its
            # lock, in sleeps. PostgreSQL serves many.
            self._loop = LoopThread.shared(2 if self.db.is_sqlite else 16, self._tool_threads)
        return self._loop

    def _tool_threads(self) -> ToolThreads:
        worker = self.settings.worker
        return ToolThreads(
            worker.tool_threads,
            stuck_limit=worker.tool_threads_stuck,
            on_stuck=lambda stuck: self.retire(
                f"{stuck} sync tool calls were given up on while their threads still run"
            ),
        )

    def _store_threads(self) -> Executor | None:
        """The store's threads on the process's loop; elsewhere (a caller's own loop),
        that loop's default."""
        if self._loop is not None and self._loop.loop is _running_loop():
            return self._loop.executor
        return None

    def retire(self, reason: str) -> None:
        """This worker is unwell for good (stuck tool threads, its memory over its bound):
        it takes no new turn, finishes what it holds and ends, for its supervisor to start
        a new one (`on_retire`). Once; from any thread."""
        with self._retire_lock:
            if self.retiring is not None:
                return
            self.retiring = reason
        log.error(
            "this worker retires: %s. It takes no new turn, finishes the turns it holds, "
            "and ends (exit %d) for its supervisor to start a new one",
            reason,
            EXIT_RETIRED,
        )
        for handler in self.on_retire:
            handler(reason)

    @classmethod
    def current(cls, app: Celery | None = None) -> Runtime:
        """The worker process's runtime, with its lease renewals and sweeps running.

        Its settings come from the environment and the configuration of `app`
        (else Celery's current app: the worker's), as `Settings.load` reads them.
        """
        with cls._lock:
            if cls._current is None or cls._pid != os.getpid():
                cls._current = cls.of_app(app or current_app)
                cls._pid = os.getpid()
            if app is not None:
                cls._current.app = app
            cls._current.start_background()
            return cls._current

    @classmethod
    def of_app(cls, app: Celery) -> Runtime:
        """A runtime of `app`'s worker, its background work not started: its settings, from
        the environment and the app's configuration (`Settings.load`), and the worker's own
        hooks: what the configuration names (Flower's progress events, `workers.config`),
        and announcing settled runs."""
        settings = Settings.load(conf=app.conf)
        rt = Runtime(settings, hooks=hooks_named(app.conf.get("relayq_worker_hooks", ())))
        rt.hooks.add(RunAnnouncer(settings, rt.db, rt.io))
        return rt

    def start_background(self) -> None:
        """Heartbeats, the loop's watch, sweeps and webhook deliveries, for the life of the process.

        The first heartbeat is written before this returns, so no claim of this
        process is ever seen without one.
        """
        if self._background:
            return
        recovery = self.settings.recovery
        watch = self.watch_loop(recovery.loop_stall_exit.total_seconds())
        self.heartbeat.loop_stalled = lambda: watch.stalled
        self.heartbeat.start()
        self._background = True
        atexit.register(self._forget)
        asyncio.run_coroutine_threadsafe(self._sweep_forever(), self.loop.loop)
        asyncio.run_coroutine_threadsafe(self._deliver_forever(), self.loop.loop)

    def watch_loop(self, exit_after: float) -> LoopWatch:
        """Start the watch on this process's loop (`tasks.loopwatch`): a stall is logged,
        and ends the process once it lasts `exit_after` seconds."""
        watch = self.loopwatch = LoopWatch(
            self.loop.loop,
            stall=self.settings.recovery.loop_stall.total_seconds(),
            exit_after=exit_after,
        )
        watch.start()
        return watch

    def _forget(self) -> None:
        """At exit: the claims still held go to other workers at their next sweep."""
        if self.loopwatch is not None:
            self.loopwatch.stop()  # the loop may well stop turning now
        self.heartbeat.stop()
        try:
            forget_worker(self.db, self.worker_id)
        except Exception as exc:  # the heartbeat's timeout does it later
            log.warning("could not sign the worker off: %s", type(exc).__name__)

    async def _sweep_forever(self) -> None:
        # Every worker sweeps (from its start, then with jitter), so no run waits
        # on a beat process for its lost message or dead worker.
        while True:
            try:
                await self.sweep()
            except Exception as exc:
                log.warning("sweep failed: %s", safe_text(exc))
            every = self.settings.recovery.sweep_every.total_seconds()
            await asyncio.sleep(every * random.uniform(0.8, 1.2))

    async def _deliver_forever(self) -> None:
        # Every worker process sends webhooks; the store's claims share the work out.
        if self.settings.webhooks.endpoints:
            sender = WebhookSender.from_settings(self.settings, self.db, io=self.io)
            await sender.run_forever()

    async def sweep(self) -> SweepReport:
        """One sweep of the store, with what the broker still holds; sends what it finds."""
        waiting = await self.io(self._waiting)
        report = await self.io(
            sweep,
            self.db,
            recovery=self.settings.recovery.bounds(),
            waiting=waiting,
            worker=self.worker_id,
            working=self.working.runs,
            heartbeats_steady=self.heartbeat.steady,
        )
        await self.dispatch(report.outbox)
        await self._retain(report)
        return report

    async def _retain(self, report: SweepReport) -> None:
        """What the retentions let go: one transaction's worth of each a sweep, since every
        worker sweeps every few seconds (`store.retention`); on a thread, never inline on
        the loop: a purge's transactions are long beside a turn's, and pause between."""
        now = datetime.now(UTC)
        runs = self.settings.recovery.retention
        if runs is not None:
            purged = await self._store.offload(
                purge_finished, self.db, now - runs, limit=RETENTION_CHUNK
            )
            report.purged = purged.runs
        events = self.settings.webhooks.retention
        if events is not None:
            gone = await self._store.offload(purge_events, self.db, now - events, limit=EVENT_CHUNK)
            report.purged_events = gone.rows.get("relayq_events", 0)
        audit = self.settings.recovery.audit_retention
        if audit is not None:
            report.purged_decisions = await self._store.offload(
                purge_decisions, self.db, now - audit, limit=DECISION_CHUNK
            )

    def _waiting(self) -> dict[str, datetime | None] | None:
        """When the oldest message still in each queue (at any priority) was sent; a
        queue holding a message that is not one we know is left out (nothing is taken
        for lost there)."""
        if self._peek is None:
            self._peek = QueuePeek(self.settings)
        # The active batches' queues too, whichever worker consumes them: a batch turn
        # lost with a dead worker or an emptied broker is sent again like any other.
        queues = (*self.peeked_queues(), *active_batch_queues(self.db))
        tails = self._peek.oldest(queues)
        if tails is None:
            return None
        waiting: dict[str, datetime | None] = {}
        for queue, task_ids in tails.items():
            sent = [sent_at(self.db, task_id) for task_id in task_ids]
            known = [moment for moment in sent if moment is not None]
            if len(known) == len(sent):
                waiting[queue] = min(known, default=None)
        return waiting

    def peeked_queues(self) -> tuple[str, ...]:
        """The queues whose backlog the sweeper reads: relayq's, and its agents' own."""
        agents = sorted({a.queue for a in self.agents.values()} - {TURN_QUEUE})
        return (TURN_QUEUE, ANSWER_QUEUE, *agents)

    def known_agent(self, name: str) -> Agent | None:
        """The agent called `name` in this process, if any."""
        return self.agents.get(name)

    def agent(self, name: str) -> Agent:
        """The agent to run a turn of `name` with: UnknownAgent, or AgentError when its
        policy does not fit these settings (a turn time limit above the worker's)."""
        agent = self.known_agent(name)
        if agent is None:
            raise UnknownAgent(name, tuple(sorted(self.agents)))
        self.settings.check_agent(agent)
        return agent

    @property
    def sender(self) -> Celery:
        """The app to send messages with: the worker's, or a sender of our own."""
        if self.app is not None:
            return self.app
        if self._sender is None:
            self._sender = sender_app(self.settings)
        return self._sender

    async def io(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a store call: inline for SQLite while its lock is free, else on the I/O
        threads (`tasks.storeio`)."""
        return await self._store(fn, *args, **kwargs)

    async def patiently(
        self,
        fn: Callable[P, T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """`io`, tried again with backoff (at most `STORE_RETRY_MAX` apart) for as long as
        the store is unavailable: for calls that are safe to repeat, and whose task would
        otherwise end without having done its work (a claim, an answer's application)."""
        tries = 0
        while True:
            try:
                result = await self.io(fn, *args, **kwargs)
            except StoreUnavailable as exc:
                self._store_outage(exc)
                await asyncio.sleep(backoff(tries, None, base=0.1, cap=STORE_RETRY_MAX))
                tries += 1
                continue
            if tries:
                self._store_outage(None)
            return result

    def _store_outage(self, error: StoreUnavailable | None) -> None:
        """Log a store outage once as it starts and once as it ends, however many calls
        wait it out."""
        if error is not None and self._outage_since is None:
            self._outage_since = time.monotonic()
            log.warning("%s; the turns and answers in hand wait for it", error)
        elif error is None and self._outage_since is not None:
            lasted, self._outage_since = time.monotonic() - self._outage_since, None
            log.warning("the store answers again, after %.1f s", lasted)

    def wait(self, work: Coroutine[Any, Any, T]) -> T:
        """What `work` returned, or its exception raised here, in a task body.

        So Celery's tracer reports the task as it went: `task_prerun` before the
        work, `task_success` (with the runtime) or `task_failure` after it, on any
        pool. Under a classic pool the body runs the work on the process's loop and
        waits. Under the asyncio pool (`workers.aio`) the body runs in a greenlet of
        the consumer's thread: it hands the work to the pool (`defer`) and sleeps,
        blocking nothing, until the pool wakes it with the result or the exception.
        """
        if not defer(work):
            return self.loop.run(work)
        pool = getcurrent().parent
        if pool is None:
            raise RuntimeError("a task body deferred its work to a caller that cannot wake it")
        result: T = pool.switch()
        return result

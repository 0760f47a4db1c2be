"""What one worker process holds: its settings, store, agents, hooks and dispatch.

`Runtime` is the process's container: what a turn, an answer or a sweep needs, built
once per process (`tasks.runner.process.current_runtime`) or by a client that runs turns
itself (`DurableClient(eager=True)`). Its event loop is `tasks.runner.loop`; its
background work, `tasks.runner.housekeeping`.

The store's calls are blocking: on SQLite they run inline when its write lock is free
(each takes a fraction of a millisecond), and on an I/O thread when another process
holds it; on PostgreSQL always in a thread pool. Nothing that waits on the store waits
on the loop: not the heartbeat (`tasks.runner.heartbeat`), not a store call stuck behind
a long transaction.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from concurrent.futures import Executor
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

from celery import Celery

from relayq.agents import Agent, UnknownAgent, load_agents, registered_agents
from relayq.retry import backoff
from store import (
    Database,
    StoreUnavailable,
    migrate,
)
from store.workers import HOSTNAME
from tasks.broker.announce import RunAnnouncer
from tasks.broker.dispatch import BrokerDispatch, Dispatch
from tasks.broker.publish import sender_app
from tasks.hooks import Hooks, RunHooks, hooks_named
from tasks.observability.metrics import Metrics, observe_store_calls
from tasks.observability.tracing import Tracing
from tasks.runner.alone import AloneProcesses
from tasks.runner.heartbeat import Heartbeat
from tasks.runner.loop import LoopThread
from tasks.runner.tool_threads import ToolThreads
from tasks.runner.transcripts import Transcripts
from tasks.settings import Settings
from tasks.storeio import StoreCalls, StoreDoor

__all__ = ["EXIT_RETIRED", "Runtime", "Working"]

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
    """The process's store, agents, hooks and dispatch, and its loop once needed."""

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
        self.store = StoreDoor(
            db, StoreCalls(inline=self.inline_store, executor=self._store_threads)
        )
        """The store's verbs, run from the loop (`tasks.storeio`)."""
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
        """Transcripts of the runs whose next turn this process queued
        (`tasks.runner.transcripts`)."""
        self.worker_id = f"{HOSTNAME}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        """This process, as its claims name it; they last while its heartbeat does."""
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
                Tracing(self.store, self.patiently),
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
        """On the loop: what the current task does, named in a stall's log
        (`LoopThread.enter`)."""
        if self._loop is not None:
            self._loop.enter(what)

    def leave(self) -> None:
        if self._loop is not None:
            self._loop.leave()

    @contextmanager
    def doing(self, what: str) -> Iterator[None]:
        """`enter` for the block (`LoopThread.doing`)."""
        if self._loop is None:
            yield
            return
        with self._loop.doing(what):
            yield

    def _make_dispatch(self) -> Dispatch:
        return BrokerDispatch(lambda: self.sender, self.store)

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
    def of_app(cls, app: Celery) -> Runtime:
        """A runtime of `app`'s worker, its background work not started: its settings, from
        the environment and the app's configuration (`Settings.load`), and the worker's own
        hooks: what the configuration names (Flower's progress events, `workers.config`),
        and announcing settled runs."""
        settings = Settings.load(conf=app.conf)
        rt = Runtime(settings, hooks=hooks_named(app.conf.get("relayq_worker_hooks", ())))
        rt.hooks.add(RunAnnouncer(settings, rt.store))
        return rt

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

    async def patiently(
        self, call: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """`await call(*args, **kwargs)` (a store verb), tried again with backoff (at most
        `STORE_RETRY_MAX` apart) for as long as the store is unavailable: for calls that
        are safe to repeat, and whose task would otherwise end without having done its
        work (a claim, an answer's application)."""
        tries = 0
        while True:
            try:
                result = await call(*args, **kwargs)
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

"""What one worker process holds: the store, its agents, and an event loop for turns.

Turns are coroutines (`relayq.loop.take_turn`); the loop runs in a thread of
its own for the life of the process, so connections a model or a tool opens
are reused from turn to turn. Built lazily, once per process: a forked
child builds its own.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

from celery import Celery

from relayq.agents import Agent, AgentError, load_agents, registered_agents
from store import Database, migrate
from tasks.publish import sender_app
from tasks.settings import Settings

__all__ = ["LoopThread", "Runtime"]

T = TypeVar("T")


class LoopThread:
    """An asyncio loop in a daemon thread; `run` submits a coroutine and waits for it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="relayq-loop", daemon=True
        )
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()
            raise


class Runtime:
    _current: Runtime | None = None
    _pid: int | None = None
    _lock = threading.Lock()

    def __init__(self, settings: Settings, *, agents: Mapping[str, Agent] | None = None) -> None:
        self.settings = settings
        self.db = Database(settings.database_url)
        migrate(self.db)
        if settings.agents:
            load_agents(settings.agents)
        self.agents: Mapping[str, Agent] = agents if agents is not None else registered_agents()
        self.loop = LoopThread()
        self._sender: Celery | None = None

    def agent(self, name: str) -> Agent:
        agent = self.agents.get(name)
        if agent is None:
            known = ", ".join(sorted(self.agents)) or "none"
            raise AgentError(
                f"unknown agent {name!r} on this worker (registered: {known}); "
                "list the module that defines it in RELAYQ_AGENTS",
                name,
            )
        return agent

    @property
    def sender(self) -> Celery:
        """An app to send messages with when no task (and so no worker app) is at hand."""
        if self._sender is None:
            self._sender = sender_app(self.settings)
        return self._sender

    @classmethod
    def current(cls) -> Runtime:
        with cls._lock:
            if cls._current is None or cls._pid != os.getpid():
                cls._current = Runtime(Settings.from_env())
                cls._pid = os.getpid()
            return cls._current

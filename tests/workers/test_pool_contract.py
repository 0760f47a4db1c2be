"""What the asyncio pool (`workers.aio`) relies on in Celery, pinned in one process.

The pool hands Celery's own tracer to a greenlet per task and Celery's own
request takes the outcome, as in a worker; no broker, no store. Each test
fails when Celery changes what the pool counts on:

- `BasePool.apply_async` calls `on_apply(target, args, kwargs, callback=,
  accept_callback=)`, `target` is the tracer and its return value is what
  `callback` (`Request.on_success`) takes;
- the tracer is a plain call that can sleep in a greenlet: it sends
  `task_prerun` before the body and `task_success` / `task_failure` /
  `task_retry` and `task_postrun` after it, with the runtime across the sleep;
- the task request (`Task.request`) is kept per greenlet (`LocalStack`);
- a body that raises `Retry` is a retry to Celery's request: acknowledged, a
  task-retried event, no task-failed;
- a failure reported through `callback` sends task-failed but not `task_failure`
  again (the tracer sent it);
- `Request.cancel` calls `terminate(signal)` on what `apply_async` returned.

The contract between the pool and a body (`tasks.runner.loop.LoopThread.wait`): the body
defers its coroutine (`tasks.runner.loop.defer`), then switches to its greenlet's
parent; it wakes with the coroutine's result, or with its exception raised.
"""

from __future__ import annotations

import asyncio
import os
import select
import time
import warnings
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
from celery import Celery, Task, current_app
from celery.exceptions import CDeprecationWarning, Retry
from celery.signals import task_failure, task_postrun, task_prerun, task_retry, task_success
from celery.worker.request import Request, create_request_cls
from greenlet import getcurrent  # type: ignore[import-untyped]

from tasks.runner.loop import LoopThread, defer
from workers.aio import AsyncioPool, requests_kept_apart


def _wait(work: Coroutine[Any, Any, Any]) -> Any:
    """A body's side of the contract (as `tasks.runner.loop.LoopThread.wait` under the pool)."""
    assert defer(work), "the pool defers"
    return getcurrent().parent.switch()


class Hub:
    """The part of kombu's hub the pool uses: one reader, run when its fd is readable."""

    def __init__(self) -> None:
        self.readers: dict[int, Callable[[], None]] = {}

    def add_reader(self, fd: int, callback: Callable[[], None]) -> None:
        self.readers[fd] = callback

    def run_until(self, done: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, "the pool did not report in time"
            ready, _, _ = select.select(list(self.readers), [], [], 0.05)
            for fd in ready:
                self.readers[fd]()


class Events:
    """A worker's event dispatcher, as Celery's request uses it."""

    enabled = True

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send(self, type: str, **fields: Any) -> None:
        self.sent.append((type, fields))

    def types(self, task_id: str) -> list[str]:
        return [t for t, f in self.sent if f.get("uuid") == task_id]

    def of(self, task_id: str, type: str) -> dict[str, Any]:
        return next(f for t, f in self.sent if t == type and f.get("uuid") == task_id)


class Worker:
    """An app, the pool on a hub, and Celery's request class, as a worker builds them."""

    def __init__(self) -> None:
        # Current, as a worker's app is: Celery's tracer finds the task through it.
        self.previous = current_app._get_current_object()
        self.app = Celery("pool-contract")
        self.app.conf.task_acks_late = True
        self.hub = Hub()
        self.pool = AsyncioPool(limit=10)
        self.pool._loop = LoopThread.shared(1)  # `on_start` would build the worker's runtime
        self.pool.register_with_event_loop(self.hub)
        self.events = Events()
        self.acked: list[str] = []
        self.signals: list[dict[str, Any]] = []
        self.receivers: list[tuple[Any, Callable[..., None], Task]] = []

    def task(self, fn: Callable[..., Any]) -> Task:
        name = f"contract.{fn.__name__}"
        self.app.task(bind=True, name=name, shared=False)(fn)
        with warnings.catch_warnings():
            # Finalizing binds relayq's shared tasks here too; Celery 5.7 deprecates
            # their `queue=` attribute, which is not this test's business.
            warnings.simplefilter("ignore", CDeprecationWarning)
            self.app.finalize()
        task: Task = self.app.tasks[name]
        for signal in (task_prerun, task_success, task_failure, task_retry, task_postrun):
            receiver = self._record(signal.name)
            signal.connect(receiver, sender=task, weak=False)
            self.receivers.append((signal, receiver, task))
        return task

    def _record(self, name: str) -> Callable[..., None]:
        def record(sender: Task, **kw: Any) -> None:
            # Which task: the id Celery passes, or the request it passes, else the current one.
            request = kw.get("request")
            task_id = kw.get("task_id") or getattr(request, "id", None) or sender.request.id
            self.signals.append({**kw, "signal": name, "id": task_id, "current": sender.request.id})

        return record

    def request(self, task: Task, task_id: str, *args: Any) -> Request:
        from celery.contrib.testing.mocks import TaskMessage

        message = TaskMessage(task.name, id=task_id, args=args)
        cls = create_request_cls(Request, task, self.pool, "host", self.events, app=self.app)
        return cls(
            message,
            on_ack=lambda *_: self.acked.append(task_id),
            app=self.app,
            hostname="host",
            eventer=self.events,
            task=task,
            connection_errors=(),
            body=message.body,
            headers=message.headers,
            decoded=False,
            utc=True,
        )

    def seen(self, task_id: str) -> list[str]:
        return [s["signal"] for s in self.signals if s["id"] == task_id]

    def close(self) -> None:
        for signal, receiver, task in self.receivers:
            signal.disconnect(receiver, sender=task)
        self.previous.set_current()


@pytest.fixture
def worker() -> Iterator[Worker]:
    w = Worker()
    yield w
    w.close()


def test_celery_keeps_a_task_request_per_greenlet():
    assert requests_kept_apart()


def test_a_body_that_waits_is_reported_when_its_coroutine_ends(worker: Worker):
    async def slow(n: int) -> str:
        await asyncio.sleep(0.3)
        return f"slept {n}"

    def body(self: Task, n: int) -> str:
        return str(_wait(slow(n)))

    task = worker.task(body)
    # Given two tasks in flight at once, each asleep in its own greenlet
    requests = [worker.request(task, f"id-{n}", n) for n in (1, 2)]
    for req in requests:
        req.execute_using_pool(worker.pool)
    assert worker.acked == []
    assert [worker.seen(f"id-{n}") for n in (1, 2)] == [["task_prerun"]] * 2
    assert [worker.events.types(f"id-{n}") for n in (1, 2)] == [["task-started"]] * 2

    # When their coroutines end
    worker.hub.run_until(lambda: len(worker.acked) == 2)

    # Then each ended as Celery ends a task, with its own request current
    for n in (1, 2):
        task_id = f"id-{n}"
        assert worker.seen(task_id) == ["task_prerun", "task_success", "task_postrun"]
        (success,) = [
            s for s in worker.signals if s["signal"] == "task_success" and s["id"] == task_id
        ]
        assert success["current"] == task_id
        assert success["result"] == f"slept {n}"
        assert success["runtime"] >= 0.3
        assert worker.events.types(task_id) == ["task-started", "task-succeeded"]
        assert worker.events.of(task_id, "task-succeeded")["runtime"] >= 0.3
    assert sorted(worker.acked) == ["id-1", "id-2"]


def test_a_coroutine_that_raises_fails_the_task_once(worker: Worker):
    async def broken() -> str:
        raise ValueError("no")

    def body(self: Task) -> str:
        return str(_wait(broken()))

    task = worker.task(body)
    worker.request(task, "id-f").execute_using_pool(worker.pool)
    worker.hub.run_until(lambda: worker.acked == ["id-f"])

    assert worker.seen("id-f") == ["task_prerun", "task_failure", "task_postrun"]
    failure = next(s for s in worker.signals if s["signal"] == "task_failure")
    assert isinstance(failure["exception"], ValueError)
    postrun = worker.signals[-1]
    assert postrun["state"] == "FAILURE"
    assert worker.events.types("id-f") == ["task-started", "task-failed"]
    assert "ValueError" in worker.events.of("id-f", "task-failed")["exception"]


def test_a_body_that_raises_retry_is_a_retry(worker: Worker):
    async def rate_limited() -> str:
        return "retry 1 in 0.5 s: 429"

    def body(self: Task) -> str:
        raise Retry(_wait(rate_limited()), when=0.5)

    task = worker.task(body)
    worker.request(task, "id-r").execute_using_pool(worker.pool)
    worker.hub.run_until(lambda: worker.acked == ["id-r"])

    assert worker.seen("id-r") == ["task_prerun", "task_retry", "task_postrun"]
    retry = next(s for s in worker.signals if s["signal"] == "task_retry")
    assert str(retry["reason"]) == "retry 1 in 0.5 s: 429"
    assert retry["reason"].when == 0.5
    assert worker.signals[-1]["state"] == "RETRY"
    assert worker.events.types("id-r") == ["task-started", "task-retried"]


def test_a_cancelled_task_runs_to_its_end_and_is_never_acknowledged(worker: Worker):
    gate = asyncio.Event()

    async def held() -> str:
        await gate.wait()
        return "held"

    def body(self: Task) -> str:
        return str(_wait(held()))

    task = worker.task(body)
    req = worker.request(task, "id-c")
    req.execute_using_pool(worker.pool)

    # When Celery cancels it (a lost broker connection), then the coroutine ends
    req.cancel(worker.pool)
    loop = worker.pool._loop.loop
    loop.call_soon_threadsafe(gate.set)
    worker.hub.run_until(lambda: worker.seen("id-c")[-1:] == ["task_postrun"])

    # Then the body ended as it really did, but nothing was acknowledged or reported
    assert worker.seen("id-c") == ["task_prerun", "task_retry", "task_success", "task_postrun"]
    assert worker.acked == []
    assert worker.events.types("id-c") == ["task-started", "task-cancelled"]
    assert os.getpid() == req.worker_pid

"""One way into the store from an event loop, for workers and hosts alike.

Store calls block. On PostgreSQL each goes to a thread (its round trips must
not stall the loop). On SQLite a call runs inline, on the loop, when the
write lock is free right now (a fraction of a millisecond, and no thread
handoffs: about 1.3x the turns per second); when another process holds the
lock, its first write fails at once, having done nothing (`store.StoreBusy`,
`store.db.impatient`), and the call waits for the lock on a thread instead:
a long transaction elsewhere never stops the loop. This process's own writers
are waited for, one short transaction each (`store.sqlite_writes`).

`StoreDoor` gives those calls names: the store's verbs as its methods
(`await door.run_result(run_id)`), each one `store` function named where the
verb is declared (its definition is one step from there), called with the
door's database before its own arguments. A verb declared `long` (a listing, a
purge, a batch's start) always runs on a thread. A function of the caller's own
over the store (a composed read, a health check) goes through `call` or
`offload`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import Concatenate, Generic, ParamSpec, Protocol, Self, TypeVar, overload

from store import (
    StoreBusy,
    answers,
    audit,
    batch_start,
    batches,
    budgets,
    grants,
    leases,
    ledger,
    maintenance,
    outbox,
    queries,
    request_listing,
    requests,
    retention,
    runs,
    traces,
    turns,
    webhooks,
)
from store.db import Database, impatient

__all__ = ["Patience", "StoreCalls", "StoreDoor", "at_once"]

T = TypeVar("T")
P = ParamSpec("P")


class StoreCalls:
    """Runs store calls for one loop's owner: `await calls(fn, *args)`."""

    def __init__(
        self,
        *,
        inline: bool,
        executor: Callable[[], Executor | None],
        ready: Callable[[], bool] | None = None,
        open: Callable[[], object] | None = None,
    ) -> None:
        self.inline = inline
        """SQLite: try inline first."""
        self._executor = executor
        """The threads to use (None: the loop's default), asked for when first needed."""
        self._ready = ready
        """Asked before each call whether the store is open (a client's: False while new,
        RuntimeError once closed); when it is not, `open` runs first, on a thread."""
        self._open = open

    async def __call__(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        await self._prepare()
        if self.inline:
            # StoreBusy: another process holds the lock; the call waits for it on a thread.
            with contextlib.suppress(StoreBusy), impatient():
                return fn(*args, **kwargs)
        return await self.offload(fn, *args, **kwargs)

    async def offload(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """On a thread whatever the store: for calls that take long on any (a batch's start)."""
        await self._prepare()
        return await self._thread(functools.partial(fn, *args, **kwargs))

    async def _prepare(self) -> None:
        if self._ready is not None and not self._ready() and self._open is not None:
            await self._thread(self._open)

    async def _thread(self, call: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor(), call)


class _Verb(Generic[P, T]):
    """A store function as the door's method: the database goes in first."""

    def __init__(self, fn: Callable[Concatenate[Database, P], T], *, long: bool = False) -> None:
        self.fn = fn
        self.long = long

    @overload
    def __get__(self, door: None, owner: type) -> Self: ...
    @overload
    def __get__(self, door: StoreDoor, owner: type) -> Callable[P, Awaitable[T]]: ...
    def __get__(self, door: StoreDoor | None, owner: type) -> Self | Callable[P, Awaitable[T]]:
        if door is None:
            return self
        return functools.partial(door._run, self)


verb = _Verb


class Patience(Protocol):
    """How a caller awaits a verb it cannot do without: at once, or (a worker's
    `Runtime.patiently`) again and again for as long as the store is unavailable."""

    async def __call__(
        self, call: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> T: ...


async def at_once(call: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """`Patience` that awaits once: a store outage is the caller's to handle."""
    return await call(*args, **kwargs)


class StoreDoor:
    """The store's verbs for one loop's owner (a client, a worker's runtime)."""

    def __init__(self, db: Database, calls: StoreCalls) -> None:
        self.db = db
        """The database every verb runs on."""
        self._calls = calls

    async def _run(self, verb: _Verb[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        run = self._calls.offload if verb.long else self._calls
        return await run(verb.fn, self.db, *args, **kwargs)

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """A blocking call of the caller's own, run as a store call is."""
        return await self._calls(fn, *args, **kwargs)

    async def offload(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """A blocking call of the caller's own that takes long on any store: on a thread."""
        return await self._calls.offload(fn, *args, **kwargs)

    # Runs and their results.
    create_run = verb(runs.create_run)
    create_runs = verb(runs.create_runs, long=True)
    cancel_run = verb(runs.cancel_run)
    get_run = verb(queries.get_run)
    run_result = verb(queries.run_result)
    run_view = verb(queries.run_view)
    list_runs = verb(queries.list_runs)
    settled = verb(queries.settled)
    settled_many = verb(queries.settled_many)

    # A turn, from its claim to its end.
    claim_turn = verb(turns.claim_turn)
    save_reply = verb(turns.save_reply)
    finish_turn = verb(turns.finish_turn)
    finish_cancelled = verb(turns.finish_cancelled)
    retry_turn = verb(turns.retry_turn)
    requeue_turn = verb(turns.requeue_turn)
    fail_run = verb(turns.fail_run)
    budget_gate = verb(budgets.budget_gate)
    ledger_get = verb(ledger.ledger_get)
    ledger_start = verb(ledger.ledger_start)
    ledger_put_all = verb(ledger.ledger_put_all)

    # Requests and their answers.
    get_request = verb(requests.get_request)
    get_requests = verb(requests.get_requests)
    run_of_request = verb(requests.run_of_request)
    query_requests = verb(request_listing.query_requests, long=True)
    all_requests = verb(request_listing.all_requests, long=True)
    accept_answer = verb(answers.accept_answer)
    accept_many = verb(answers.accept_many)
    apply_answer_of = verb(answers.apply_answer_of)
    bulk_choice = verb(answers.bulk_choice, long=True)
    decisions_of = verb(audit.decisions_of)
    list_decisions = verb(audit.list_decisions, long=True)
    note_policy = verb(audit.note_policy)
    use_grant = verb(grants.use_grant)
    make_grant = verb(grants.make_grant)
    get_grant = verb(grants.get_grant)
    list_grants = verb(grants.list_grants, long=True)
    revoke_grant = verb(grants.revoke_grant)
    grants_of_request = verb(grants.grants_of_request)

    # Relay calls leased by hosts.
    lease_calls = verb(leases.lease_calls)
    heartbeat_lease = verb(leases.heartbeat_lease)
    release_lease = verb(leases.release_lease)
    lease_result = verb(leases.lease_result)
    offered = verb(leases.offered)

    # Batches.
    start_batch = verb(batch_start.start_batch, long=True)
    batch_prompts = verb(batch_start.batch_prompts, long=True)
    find_batch = verb(batches.find_batch, long=True)
    batch_status = verb(batches.batch_status)
    batch_results = verb(batches.batch_results, long=True)
    list_batches = verb(batches.list_batches, long=True)
    cancel_batch = verb(batches.cancel_batch, long=True)

    # The outbox, sweeps and retention.
    mark_published = verb(outbox.mark_published)
    resend_turns = verb(outbox.resend_turns)
    sweep = verb(maintenance.sweep)
    purge_finished = verb(retention.purge_finished, long=True)
    purge_events = verb(retention.purge_events, long=True)
    purge_decisions = verb(retention.purge_decisions, long=True)

    # Webhook deliveries and traces.
    fan_out = verb(webhooks.fan_out)
    claim_due = verb(webhooks.claim_due)
    record_deliveries = verb(webhooks.record)
    request_trace = verb(traces.request_trace)

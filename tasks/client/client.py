"""`DurableClient`: the client's side of durable runs.

It writes to the store and sends task messages; workers in other processes
(or machines) run the turns. Results are the same `RunResult`s the
in-process client returns (docs/durable-runs.md shows it at work).

`DurableClient(eager=True)` runs every turn in the calling process instead
(see `tasks.client.eager`): the same verbs and results, with no broker and no worker.

The verbs' work is done by the client's helpers: `tasks.client.starting` starts runs,
`tasks.client.settling` waits for them to settle, `tasks.client.answering` takes answers.
"""

from __future__ import annotations

import inspect
import threading
import time
import warnings
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, Literal

from celery import Celery

from relayq import Answer, Request, RunResult
from relayq.agents import Agent, registered_agents
from relayq.budgets import Budget
from relayq.grants import GrantTerms
from relayq.loop import WaitFor
from store import (
    BatchCancel,
    Database,
    OutboxRow,
    Page,
    RequestQuery,
    RunQuery,
    RunRow,
    Started,
    StoredRequest,
    migrate,
)
from store.audit import Decider
from store.leases import Lease
from store.paging import DEFAULT_PAGE
from store.requests import RequestSort, SortOrder
from tasks.broker.dispatch import BrokerDispatch, Dispatch
from tasks.broker.publish import sender_app
from tasks.client.answering import Answering, answer_echoing
from tasks.client.leasing import Leasing
from tasks.client.settling import Settling, Waiting
from tasks.client.starting import Starting
from tasks.client.waiting import RunWaiter, WaitTimeout
from tasks.hooks import Hooks, RunSettled, Sending, hooks_named
from tasks.observability.tracing import Tracing
from tasks.settings import Settings
from tasks.storeio import StoreCalls, StoreDoor

__all__ = ["DurableClient", "WaitTimeout"]


class DurableClient:
    """Start, watch, answer and cancel durable runs.

    Reads the same settings as the workers (`RELAYQ_DATABASE_URL`,
    `RELAYQ_BROKER_URL`, ..., then `app`'s configuration: see `Settings.load`);
    the arguments override them. With `wait_for`, `run` answers each request
    as it comes, like the in-process client does.

    Waiting for results (`result(wait=True)`, `run`, `run_with_answer`) is pushed:
    workers announce each run that may have settled (`tasks.broker.announce`), and one
    waiter per client and event loop reads the status of every run so woken in
    one statement (`tasks.client.waiting`), with a fallback read of every waited run
    each `recheck_every` in case an announcement was lost. `waiting="polled"`
    polls each run on its own instead, every 10 to 250 ms: the old behaviour,
    kept to compare against, and what an eager client or a broker other than
    Redis gets.

    A message a change stored but could not send (the broker did not answer) is
    logged, or handed to `on_unsent` when given; a worker's sweep sends it once the
    broker is back.

    Store calls run inline on SQLite (each takes a fraction of a millisecond) and
    on threads for a database server, as a worker's do (`tasks.storeio`).

    With `eager=True` nothing is sent: each turn runs here, in this process,
    when its message would have been sent (Celery's `task_always_eager`), so
    `start` and `submit_answer` return once the run has settled again. No
    Celery app is built and no broker is needed; the store is the same.

        client = DurableClient(eager=True, database_url="sqlite:///runs.db")
        result = await client.run(my_agent, "hello")
    """

    def __init__(
        self,
        *,
        database_url: str | None = None,
        broker_url: str | None = None,
        wait_for: WaitFor | None = None,
        settings: Settings | None = None,
        app: Celery | None = None,
        eager: bool = False,
        waiting: Waiting = "pushed",
        recheck_every: timedelta = timedelta(seconds=1),
        on_unsent: Callable[[list[OutboxRow]], None] | None = None,
    ) -> None:
        if eager and app is not None:
            raise ValueError("an eager client sends nothing: it takes no Celery app")
        base = settings or Settings.load(conf=app.conf if app is not None else None)
        overrides: dict[str, Any] = {}
        if database_url:
            overrides["database_url"] = database_url
        if broker_url:
            overrides.update(broker_url=broker_url, embedded_broker=False)
        self.settings = replace(base, **overrides)
        self._db = Database(self.settings.database_url)
        self._state: Literal["new", "open", "closed"] = "new"
        self._opening = threading.Lock()
        self.eager = eager
        self._wait_for = wait_for
        if waiting not in ("pushed", "polled"):
            raise ValueError(f"waiting is pushed or polled, not {waiting!r}")
        # An eager client settles its runs itself, and only Redis carries announcements.
        pushed = not eager and self.settings.redis_url is not None
        how: Waiting = waiting if pushed else "polled"
        self.inline_store = self._db.is_sqlite
        """Store calls run on the event loop (SQLite) while its lock is free."""
        self._threads: ThreadPoolExecutor | None = None
        self.store = StoreDoor(
            self._db,
            StoreCalls(
                inline=self.inline_store,
                executor=self._client_threads,
                ready=self._is_open,
                open=self.open,
            ),
        )
        """The store's verbs, for reading it beside the client's own:
        `await client.store.get_run(run_id)` (`tasks.storeio`). Each opens the store
        first when the client is not open yet."""
        self._app: Celery | None = None
        self.hooks: Hooks
        """What watches this client's sends and decisions (`tasks.hooks`): relayq's traces and
        the hooks `RELAYQ_HOOKS` names; an eager client's runtime's, which see its turns too."""
        self._dispatch: Dispatch
        """Where the messages of this client's changes go: to the broker, or run here."""
        if eager:
            from tasks.client.eager import EagerRuntime

            runtime = EagerRuntime(self.settings, db=self._db)
            self.hooks, self._dispatch = runtime.hooks, runtime.dispatch
            self._agent_named: Callable[[str], Agent | None] = runtime.known_agent
        else:
            self._agent_named = lambda name: registered_agents().get(name)
            self._app = sender = app or sender_app(self.settings)
            self.hooks = Hooks([Tracing(self.store), *hooks_named(self.settings.hooks)])
            self._dispatch = BrokerDispatch(lambda: sender, self.store, on_unsent=on_unsent)
        # The verbs' work (composition): starting runs, waiting for them, taking answers.
        self._starts = Starting(self.settings, self.store, self._dispatch, self._publish)
        self._waits = Settling(self.settings, self.store, waiting=how, recheck_every=recheck_every)
        self._answers = Answering(self.settings, self.store, self.hooks, self._publish)
        self._leases = Leasing(
            self.store,
            self._answers,
            lambda: self._waits.waiter_here() if self._waits.pushed else None,
        )

    @property
    def waiting(self) -> Waiting:
        """How `result(wait=True)` waits: woken by announcements, or polling each run."""
        return "pushed" if self._waits.pushed else "polled"

    @waiting.setter
    def waiting(self, how: Waiting) -> None:
        self._waits.pushed = how == "pushed"

    @property
    def db(self) -> Database:
        """The store, opened (migrated to head) on first use (`open`): for reading it
        beside the client's verbs."""
        if self._state == "new":
            self.open()
        return self._db

    @db.setter
    def db(self, db: Database) -> None:
        self._db = self.store.db = db

    @property
    def recheck_every(self) -> timedelta:
        """How often every run waited on is read anyway (pushed waiting)."""
        return self._waits.recheck_every

    @recheck_every.setter
    def recheck_every(self, every: timedelta) -> None:
        self._waits.recheck_every = every

    @property
    def app(self) -> Celery:
        """The Celery app messages are sent with; an eager client has none (RuntimeError)."""
        if self._app is None:
            raise RuntimeError("an eager DurableClient sends no messages and has no Celery app")
        return self._app

    def _client_threads(self) -> ThreadPoolExecutor:
        if self._threads is None:
            # The client's own threads: `close` waits for a call still on one (a waiter's
            # read, a mark) before it closes the store's connections.
            self._threads = ThreadPoolExecutor(8, thread_name_prefix="relayq-client")
        return self._threads

    async def _publish(self, rows: Iterable[OutboxRow]) -> int:
        """Dispatch the messages a change wrote (in eager mode: run them here and now).
        Returns how many went to the broker."""
        rows = list(rows)
        await self.hooks.emit(Sending(rows))  # a new run's trace starts here
        return await self._dispatch(rows)

    async def start(
        self,
        agent: Agent | str,
        prompt: str,
        *,
        conversation_id: str | None = None,
        started_by: str | None = None,
        batch_id: str | None = None,
        job_id: str | None = None,
        budget: Budget | None = None,
    ) -> str:
        """Queue a run of `agent` on `prompt`; returns its id at once (in eager mode,
        once the run has settled). `started_by` names who asked, for the approvals
        that forbid self-approval; `batch_id` and `job_id` which batch's job it is
        (shown with its requests); `budget` what the run may spend, in place of its
        agent's budget (`relayq.budgets`).

        UnstorableInput (InputTooLarge), with nothing written, for a prompt the
        store cannot keep: a NUL character, a lone surrogate, over the size limit.
        """
        spec = await self._starts.spec(
            agent, started_by=started_by, batch_id=batch_id, budget=budget
        )
        return await self._starts.one(spec, prompt, conversation_id=conversation_id, job_id=job_id)

    async def start_many(
        self,
        agent: Agent | str,
        prompts: list[str],
        *,
        started_by: str | None = None,
        batch_id: str | None = None,
        job_ids: list[str] | None = None,
        budget: Budget | None = None,
    ) -> list[str]:
        """Queue one run per prompt; returns their ids in order. `job_ids` (one per
        prompt) and `batch_id` record which batch's jobs they are; `budget` is what each
        run may spend.

        For many runs: far faster than `start` in a loop. One prompt the store cannot
        keep refuses them all (UnstorableInput), nothing written. They are written a
        chunk at a time (`store.runs.CHUNK`), so a long start never holds SQLite's lock
        for long; for each job started exactly once across crashes, use `start_batch`.
        """
        spec = await self._starts.spec(
            agent, started_by=started_by, batch_id=batch_id, budget=budget
        )
        return await self._starts.many(spec, prompts, job_ids=job_ids)

    async def start_batch(
        self,
        agent: Agent | str,
        jobs: Sequence[tuple[str, str]],
        *,
        batch_id: str | None = None,
        name: str | None = None,
        started_by: str | None = None,
        restart_changed: bool = False,
        options: dict[str, Any] | None = None,
        budget: Budget | None = None,
        run_budget: Budget | None = None,
    ) -> Started:
        """Start the jobs (`(job id, prompt)`, in input order) of a batch that have no run
        yet, a chunk at a time, each chunk's messages sent as it commits: a rerun (after
        a crash between chunks, say) starts only what is missing, never a job twice.

        Returns every job's run. JobChanged, starting nothing, for a job whose prompt
        changed since its run started (unless `restart_changed`: the old run is
        cancelled and a new one takes the job); UnstorableInput for a prompt the
        store cannot keep. `budget` is what the batch's runs may spend together (a
        rerun's replaces the batch's), `run_budget` what each run it starts may; `name`
        what a new batch is known by (`store.find_batch`).
        """
        spec = await self._starts.spec(
            agent, started_by=started_by, batch_id=batch_id, budget=run_budget
        )
        return await self._starts.batch(
            spec, jobs, name=name, restart_changed=restart_changed, options=options, budget=budget
        )

    async def result(
        self, run_id: str, *, wait: bool = False, timeout: float | None = None
    ) -> RunResult:
        """The run as it stands; with `wait`, once it is done, pending, failed or cancelled.

        Many runs are best waited on together; one query reads them all each time:

            results = await asyncio.gather(*(client.result(r, wait=True) for r in run_ids))
        """
        if wait:
            await self._waits.until_settled(run_id, timeout)
        return await self.store.run_result(run_id)

    async def settled(self, run_id: str, *, timeout: float | None = None) -> None:
        """Return once the run is done, pending, failed or cancelled, reading nothing else:
        for a client following many runs, that reads them all together when one moves."""
        await self._waits.until_settled(run_id, timeout)

    async def run(
        self,
        agent: Agent | str,
        prompt: str,
        *,
        conversation_id: str | None = None,
        timeout: float | None = None,
        budget: Budget | None = None,
    ) -> RunResult:
        """Start a run and wait until it is done or waits on a request."""
        since = self._waits.listening()
        run_id = await self.start(agent, prompt, conversation_id=conversation_id, budget=budget)
        return await self._follow(run_id, timeout, since)

    def _waiter_here(self) -> RunWaiter:
        """This client's waiter on the running loop (a client may outlive a loop)."""
        return self._waits.waiter_here()

    async def _follow(self, run_id: str, timeout: float | None, since: int | None) -> RunResult:
        """Wait for the run to settle, answering each request it waits on with `wait_for`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            await self._waits.until_settled(run_id, left, since)
            res = await self.store.run_result(run_id)
            if res.status != "pending" or self._wait_for is None or res.pending is None:
                return res
            answer = self._wait_for(res.pending)
            if inspect.isawaitable(answer):
                answer = await answer
            since = self._waits.listening()
            await self.submit_answer(answer)

    async def requests(
        self,
        status: str | Sequence[str] | None = "open",
        *,
        run_id: str | None = None,
        agent: str | None = None,
        kind: str | None = None,
        tool: str | None = None,
        group: str | None = None,
        search: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        sort: RequestSort = "age",
        order: SortOrder = "asc",
        limit: int = DEFAULT_PAGE,
        cursor: str | None = None,
        all_pages: bool = False,
    ) -> Page[StoredRequest]:
        """A page of stored requests, oldest first; `status=None` (or several) for more
        than the open ones. See `store.RequestQuery` for each filter.

            page = await client.requests("open", group="finance")
            print(f"{len(page)} of {page.total}")
            later = await client.requests("open", group="finance", cursor=page.next_cursor)
            every = await client.requests("open", all_pages=True)   # one page of them all

        A page is a sequence of its items. BadQuery for a filter, sort, limit (1 to
        500) or cursor the store does not take.
        """
        query = RequestQuery(
            status=status,
            run_id=run_id,
            agent=agent,
            kind=kind,
            tool=tool,
            group=group,
            search=search,
            created_after=created_after,
            created_before=created_before,
            sort=sort,
            order=order,
            limit=limit,
            cursor=cursor,
        )
        return await self.query_requests(query, all_pages=all_pages)

    async def query_requests(
        self, query: RequestQuery, *, all_pages: bool = False
    ) -> Page[StoredRequest]:
        """The page of stored requests `query` picks (`requests` builds one from keywords;
        the CLI and the API from their options); with `all_pages`, one page of them all.
        BadQuery for a filter, sort, limit or cursor the store does not take."""
        if all_pages:
            return await self.store.all_requests(query)
        return await self.store.query_requests(query)

    async def submit_answer(
        self,
        answer: Answer | dict[str, Any],
        *,
        answered_by: str | None = None,
        partial: bool = False,
        decider: Decider | None = None,
        decision: bool = False,
        grant: GrantTerms | None = None,
    ) -> str:
        """Validate and record an answer, then resume its run; returns the run id (in
        eager mode, once the run has settled again).

        `decider` says who answers, for the audit trail and an approval's groups
        (by default `answered_by`, through Python). An answer to an approval is a
        decision (`relayq.approvals.approve`, `edit`, `decline`) and counts as its
        decider's vote: the run resumes once the request's quorum is reached.

        Raises ResumeError, changing nothing, for a malformed answer (parsed as
        strictly as the HTTP API parses it: `"ok": "yes"` is refused), an
        unknown or already answered request, an expired one, or results that do
        not fit its calls; UnstorableAnswer (AnswerTooLarge) for one the store
        cannot keep. Of two answers to one request exactly one is taken. With
        `partial`, the results are kept and the request stays open until every
        call has one. With `decision`, the answer was given as a decision (approve,
        edit, decline): NotAnApproval, changing nothing, for a request that is not
        an approval, whose calls take results instead. With `grant`, an approval also
        makes a standing grant for calls to come (`relayq.grants.GrantTerms`), or
        GrantRefused, changing nothing.
        """
        return await self._answers.submit(
            answer,
            answered_by=answered_by,
            partial=partial,
            decider=decider,
            decision=decision,
            grant=grant,
        )

    async def submit_many(
        self,
        answers: Sequence[Answer | dict[str, Any]],
        *,
        decider: Decider,
        revisions: Mapping[str, int] | None = None,
    ) -> list[str]:
        """Decide many requests at once, all or nothing; returns the runs that resume.

        `revisions` maps request ids to the `revision` the decider saw (a preview):
        a request decided or voted on since is refused rather than decided blind.
        BulkRefused, with nothing changed, names every request that refused its
        answer and why; each answer is checked as `submit_answer` checks one.
        """
        return await self._answers.submit_many(answers, decider=decider, revisions=revisions)

    async def decide_many(
        self,
        revisions: Mapping[str, int | None],
        decision: Literal["approve", "decline"],
        *,
        decider: Decider,
        reason: str | None = None,
    ) -> list[str]:
        """Approve, or decline with `reason`, every request named, all or nothing, as
        `decider`; `revisions` maps each id to the revision a preview showed (None:
        whatever it is now). Returns the runs that resume.

        Only approval requests can be approved in bulk: a relay tool's result is
        the answerer's own, never a stock "approved". BulkRefused names every
        request that refuses the decision (unknown, not an approval, decided or
        voted on since, not the decider's to decide) and nothing is changed.
        """
        return await self._answers.decide_many(revisions, decision, decider=decider, reason=reason)

    async def lease_calls(
        self,
        tools: Collection[str] | None,
        *,
        holder: str,
        limit: int = 10,
        wait: float = 0.0,
        lease: timedelta = timedelta(seconds=60),
        gone: Callable[[], Awaitable[bool]] | None = None,
    ) -> list[Lease]:
        """Lease up to `limit` relay calls of `tools` (None: any) to `holder`, each until
        its `expires_at`: the oldest calls of open requests with no result and no live
        lease. With none to offer, wait up to `wait` seconds for one (woken by the
        workers' announcements); `gone()`, asked when one is offered, says the caller left
        (then it leases nothing)."""
        return await self._leases.lease(
            tools=tools, holder=holder, limit=limit, wait=wait, lease=lease, gone=gone
        )

    def stop_lease_waits(self) -> None:
        """Answer every `lease_calls` waiting now, and every one to come, with no call:
        the API stopping (its hosts ask the next one). Safe from any thread."""
        self._leases.stop_waiting()

    async def heartbeat_lease(
        self, lease_id: str, *, holder: str, tools: Collection[str] | None = None
    ) -> datetime:
        """Extend `holder`'s lease by its length; returns when it now expires. LeaseLost
        (nothing changed) for a lease that no longer holds, UnknownLease, or LeaseRefused
        for another holder's lease or a tool outside `tools`."""
        return await self._leases.heartbeat(lease_id, holder=holder, tools=tools)

    async def release_lease(
        self, lease_id: str, *, holder: str, tools: Collection[str] | None = None
    ) -> None:
        """Hand `holder`'s leased call back at once: it is offered again (as
        `heartbeat_lease` refuses)."""
        await self._leases.release(lease_id, holder=holder, tools=tools)

    async def lease_result(
        self,
        lease_id: str,
        *,
        output: str,
        is_error: bool = False,
        host: Decider,
        tools: Collection[str] | None = None,
    ) -> str:
        """Record the leased call's result, given by `host` (the lease's holder, as the
        audit trail keeps it); the run goes on once every call of its request has one.
        Returns the run id; refuses as `heartbeat_lease` does, and as `submit_answer`
        does for an output the store cannot keep."""
        return await self._leases.result(
            lease_id, output=output, is_error=is_error, host=host, tools=tools
        )

    async def run_with_answer(
        self,
        pending: Request | dict[str, Any],
        answer: Answer | dict[str, Any],
        *,
        timeout: float | None = None,
    ) -> RunResult:
        """Answer the request a run waits on, and wait for the run to settle again."""
        reply = answer_echoing(pending, answer)
        since = self._waits.listening()
        run_id = await self.submit_answer(reply)
        return await self._follow(run_id, timeout, since)

    async def runs(
        self, status: str | None = None, *, agent: str | None = None, limit: int = 100
    ) -> list[RunRow]:
        """Stored runs, newest first."""
        query = RunQuery(status=status, agent=agent, limit=limit)
        return await self.store.list_runs(query)

    async def cancel(self, run_id: str) -> str:
        """Cancel a run; returns its status (`cancelled`, or `running` until its next boundary)."""
        asked = await self.store.cancel_run(run_id)
        self._waits.changed_here(run_id)  # no worker announces a cancel made here
        if asked.settled:  # a running run is cancelled by its turn, which says so
            await self._settled_here([run_id], asked.agent, asked.status)
        return asked.status

    async def cancel_batch(self, batch_id: str) -> BatchCancel:
        """Cancel every unfinished run of a batch; how many were in each status (a
        running one stops at its next boundary). UnknownBatch for an id the store lacks."""
        asked = await self.store.cancel_batch(batch_id)
        for run_id in asked.settled:
            self._waits.changed_here(run_id)
        await self._settled_here(asked.settled, asked.agent, "cancelled")
        return asked

    async def _settled_here(self, run_ids: Sequence[str], agent_name: str, status: str) -> None:
        """The hooks told of runs a verb here ended (no turn of theirs will say so)."""
        agent = self._agent_named(agent_name)
        for run_id in run_ids:
            settled = RunSettled(run_id, agent_name, status)
            await self.hooks.emit(settled, agent.hooks if agent is not None else ())

    async def request(self, request_id: str) -> StoredRequest:
        """The stored request, open or answered, with its run's context. UnknownRequest
        for an id the store lacks."""
        return await self.store.get_request(request_id)

    def open(self) -> DurableClient:
        """Open the store, migrating it to head (`store.migrate`), once. `with`, `async
        with` and the first verb open a client; a closed one is not opened again
        (RuntimeError)."""
        with self._opening:
            if self._state == "closed":
                raise RuntimeError("this DurableClient is closed")
            if self._state == "new":
                migrate(self._db)
                self._state = "open"
        return self

    def _is_open(self) -> bool:
        """Before each store call: False while new (the seam opens the store first, on a
        thread: a migration blocks); RuntimeError once closed."""
        if self._state == "closed":
            raise RuntimeError("this DurableClient is closed")
        return self._state == "open"

    def close(self) -> None:
        """Close what the client holds: its waiter, its threads, the store's connections,
        its Celery app. Safe to call again."""
        with self._opening:
            if self._state == "closed":
                return
            self._state = "closed"
        self._dispatch.close()
        self._waits.close()
        if self._threads is not None:
            self._threads.shutdown(wait=True)
            self._threads = None
        self._db.dispose()
        if self._app is not None:
            self._app.close()

    def __enter__(self) -> DurableClient:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> DurableClient:
        await self.store.offload(self._is_open)  # the door opens the store first, on a thread
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._waits.aclose()  # its connection closed before the loop may end
        self.close()

    def __del__(self) -> None:
        # Dropped open: its store's connections and threads were never let go.
        if getattr(self, "_state", None) == "open":
            warnings.warn(
                "a DurableClient was dropped open: close it, or use it with `with` or `async with`",
                ResourceWarning,
                stacklevel=2,
                source=self,
            )

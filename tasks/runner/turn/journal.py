"""`StoreJournal`: a turn's progress kept in the store as `relayq.loop.take_turn` makes it.

The model's reply is saved before any tool of ours runs, and each finished tool call
goes to the ledger, so a turn taken over after a crash redoes nothing that finished.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from relayq import Request, ToolResult, Usage
from relayq import transcript as tx
from relayq.loop import Journal
from store import Charge, Claim
from store.ledger import LedgerEntry
from tasks.hooks import RunHooks, ToolRan, ToolStarting
from tasks.runner.runtime import Runtime

__all__ = ["StoreJournal"]


class StoreJournal(Journal):
    """The turn's progress in the store: the reply before tools, each tool outcome after it.

    It is also the turn's cancel flag: every write reads the run's flag in the
    same transaction, so boundaries see a cancel without a query of their own.

    What a crash could not lose is written with the turn's end instead of on its
    own: a reply that runs no tool of ours (its final text, its relay calls), and
    the outcome of a call that finished with no other call of the turn running.
    Between either and the turn's end nothing runs but the loop's own code, so
    a turn taken over redoes the same as it would have; and a turn saves a
    transaction, or two.
    """

    def __init__(
        self,
        rt: Runtime,
        claim: Claim,
        *,
        runs_tool: Callable[[str], bool] = lambda name: True,
        price: Callable[[Usage], float | None] = lambda usage: None,
        charge_batch: str | None = None,
        hooks: tuple[RunHooks, ...] = (),
    ) -> None:
        self.rt = rt
        self.claim = claim
        self.hooks = hooks
        """The agent's own hooks, after the runtime's."""
        self.runs_tool = runs_tool
        """Whether a call of this name runs a tool of ours (not a relay tool, not unknown)."""
        self.price = price
        """What a reply's usage cost (None: no price)."""
        self.charge_batch = charge_batch
        self.cancelled = False
        self._fresh: int | None = None
        self.stored = claim.messages
        """The transcript as the store holds it now."""
        self.charge: Charge | None = None
        """The reply's spending, when the reply is left for the turn's end to write."""
        self.entries: list[LedgerEntry] = []
        """Outcomes left for the turn's end (or the next call's start) to record."""
        self._running = 0
        self.running: dict[str, str] = {}
        """The calls running now: call id, tool (a turn out of time names them)."""
        self._started: dict[tuple[int, str, str], float] = {}

    def is_set(self) -> bool:
        return self.cancelled

    async def model_replied(self, messages: list[dict[str, Any]]) -> None:
        usage = tx.usage_in(messages[-1])
        cost = self.price(usage) or 0.0
        calls = messages[-1].get("tool_calls") or []
        if not any(self.runs_tool(c["function"]["name"]) for c in calls):
            self.charge = Charge(usage, cost, self.charge_batch)
            return
        self.cancelled = await self.rt.store.save_reply(
            self.claim,
            messages,
            cost=cost,
            charge_batch=self.charge_batch,
        )
        self._fresh = len(messages) - 1
        self.stored = list(messages)

    async def recorded(self, at: int, call_id: str, attempt: str) -> ToolResult | Request | None:
        if at == self._fresh and not attempt:
            return None  # the reply was made in this very turn: nothing can be recorded yet
        return await self.rt.store.ledger_get(self.claim.run_id, at, call_id, attempt)

    async def starting(self, at: int, call_id: str, attempt: str, *, tool: str = "") -> int:
        # What finished before this call starts is kept first: the call may kill the worker.
        await self.flush()
        self._running += 1
        self.running[call_id] = tool or "?"
        # Until `record`, a stall of the loop names this call (`tasks.runner.loopwatch`).
        self.rt.enter(f"tool {tool or '?'} (call {call_id})")
        await self.rt.hooks.emit(
            ToolStarting(self.claim.run_id, self.claim.agent, call_id), self.hooks
        )
        self._started[at, call_id, attempt] = time.perf_counter()
        if at == self._fresh and not attempt:
            return 1  # counted when the reply was saved
        return await self.rt.store.ledger_start(self.claim.run_id, at, call_id, attempt)

    async def record(
        self, at: int, call_id: str, attempt: str, outcome: ToolResult | Request
    ) -> None:
        self._running -= 1
        self.running.pop(call_id, None)
        self.rt.leave()
        self.entries.append(LedgerEntry(at, call_id, attempt, outcome))
        if self._running > 0:
            await self.flush()  # another call still runs, and may kill the worker
        started = self._started.pop((at, call_id, attempt), None)
        if isinstance(outcome, ToolResult) and started is not None:
            ran = ToolRan(
                self.claim.run_id,
                self.claim.agent,
                call_id,
                outcome.is_error,
                time.perf_counter() - started,
            )
            await self.rt.hooks.emit(ran, self.hooks)

    async def flush(self) -> None:
        """Record the outcomes left for later now."""
        if self.entries:
            entries, self.entries = self.entries, []
            self.cancelled = await self.rt.store.ledger_put_all(self.claim.run_id, entries)

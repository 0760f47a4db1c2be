"""`StoreGatekeeper`: what a gated tool's policy decides without a person, kept in the store.

A call denied, or run because its `when=` was false, is one row of the audit trail
(`store.audit.note_policy`), written as the tool decides it, before it runs: a call
run again after its worker died finds the row and adds none. A call a standing grant
approves counts the grant's use in the transaction that writes its row
(`store.grants.use_grant`).
"""

from __future__ import annotations

from relayq.policies import Gatekeeper, GrantAsk, PolicyNote
from tasks.runner.runtime import Runtime

__all__ = ["StoreGatekeeper"]


class StoreGatekeeper(Gatekeeper):
    """The audit trail of one worker's gated calls."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def note(self, note: PolicyNote) -> None:
        await self.rt.store.note_policy(note)

    async def use_grant(self, ask: GrantAsk) -> str | None:
        return await self.rt.store.use_grant(ask)

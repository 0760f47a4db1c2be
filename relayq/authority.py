"""Who may answer what: the one table every door's answers are checked against.

An answer or a decision reaches the store through many doors (the HTTP routes,
the inbox's forms, the CLI, MCP, a host's leased result); each of them only says
who is answering, and the store asks `refusal` before anything is kept. So a door
cannot grant what another refuses.

| role | decides an approval or a budget | answers a relay call or a question |
|---|---|---|
| `approver`, `admin` | yes, within the request's groups | yes |
| `submitter` | never | of a run it started |
| `host` | never | a relay call, leased (`store.leases` checks its tools) |
| `viewer`, any other | never | never |
| in-process: Python (no role), `cli`, `system` | yes, within the request's groups | yes |

The request's own rules come on top, for every role: a decider outside the
request's approver groups, or the run's starter where self-approval is forbidden,
is refused (`store.votes`).
"""

from __future__ import annotations

from relayq.approvals import APPROVAL_KIND, BUDGET_KIND
from relayq.relay import RELAY_KIND

__all__ = ["DECIDING_KINDS", "LOCAL_ROLES", "refusal"]

DECIDING_KINDS = frozenset({APPROVAL_KIND, BUDGET_KIND})
"""Requests decided by approve, edit or decline: never by the run's own starter's role."""

LOCAL_ROLES = frozenset({None, "cli", "system"})
"""Who answers from inside the deployment (Python, a shell with the store's address, the
sweeper): trusted with every kind; the request's groups still apply."""

_ANSWERS_ALL = LOCAL_ROLES | {"approver", "admin"}


def refusal(role: str | None, kind: str, *, starter: bool) -> str | None:
    """Why `role` may not answer a request of `kind` (None: it may); `starter`: the one
    answering started the request's run.

    >>> refusal("submitter", "tool_approval", starter=True)
    "role 'submitter' may not decide a tool_approval request"
    """
    if role in _ANSWERS_ALL:
        return None
    if kind in DECIDING_KINDS:
        return f"role {role!r} may not decide a {kind} request"
    if role == "host":
        return None if kind == RELAY_KIND else f"role 'host' may not answer a {kind} request"
    if role == "submitter":
        return None if starter else "role 'submitter' may answer only the runs it started"
    return f"role {role!r} may not answer requests"

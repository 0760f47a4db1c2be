"""How a suspended run reaches an MCP client: decided here, once per call, from what the
session negotiated.

- 2026-07-28 with the tasks extension: a task (`tasks/get`, `tasks/update`);
- 2026-07-28 without it: `input_required` and a `requestState` (multi round trips);
- 2025-06-18 and 2025-11-25, form elicitation declared: `elicitation/create` requests
  inside the pending call;
- any other handshake-era session (2024-11-05 and 2025-03-26 have no elicitation): a
  result saying what the run waits on, and where to answer it.

A handshake-era result type is `CallToolResult` alone: `input_required` does not exist
there, and the clients of those revisions refuse it.
"""

from __future__ import annotations

from enum import Enum

import mcp_types as types
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from api.mcp._inputs import TASKS

__all__ = ["ELICITING_VERSIONS", "Delivery", "delivery_of"]

ELICITING_VERSIONS = ("2025-06-18", "2025-11-25")
"""The handshake-era revisions that have `elicitation/create`."""


class Delivery(Enum):
    TASK = "task"
    """A task at once; the client polls it and answers with `tasks/update`."""
    ROUND_TRIPS = "round_trips"
    """`input_required` with a `requestState`, which the client's retry brings back."""
    ELICIT = "elicit"
    """The server asks the client, inside the pending call, one elicitation per question."""
    WAITING = "waiting"
    """A `CallToolResult` that names the request the run waits on and where to answer it."""


def delivery_of(protocol_version: str, capabilities: types.ClientCapabilities | None) -> Delivery:
    """The way a run started by a call of `protocol_version`, from a client that declared
    `capabilities`, reaches that client when it suspends."""
    declared = capabilities or types.ClientCapabilities()
    if protocol_version in MODERN_PROTOCOL_VERSIONS:
        return Delivery.TASK if TASKS in (declared.extensions or {}) else Delivery.ROUND_TRIPS
    elicitation = declared.elicitation
    # An empty `elicitation: {}` is form mode, as 2025-06-18 (before modes) had it.
    form = elicitation is not None and (elicitation.form is not None or elicitation.url is None)
    if form and protocol_version in ELICITING_VERSIONS:
        return Delivery.ELICIT
    return Delivery.WAITING

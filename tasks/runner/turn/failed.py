"""A run failing in its turn: the error stored on the run, logged once, `TurnFailed` raised.

`TurnFailed` ends the turn's task as a failure Celery logs in one line, without a
traceback (`throws` on `tasks.runner.turn.task.run_turn`): the log record that explains it is
the one `fail_turn` writes (`tasks.runner.turn.failures`).
"""

from __future__ import annotations

import logging
from typing import NoReturn

from relayq import RelayqError
from relayq.limits import describe_error
from store import Claim
from tasks.runner.runtime import Runtime
from tasks.runner.turn.failures import failure_report

__all__ = ["OutOfTime", "TurnFailed", "fail_turn", "stored_error"]

# The turn's log, whichever of its modules writes to it.
log = logging.getLogger("tasks.runner.turn.task")


class TurnFailed(RelayqError):
    """The run failed in this turn; the error is stored on the run."""

    def __init__(self, run_id: str, error: str) -> None:
        super().__init__(run_id, error)
        self.run_id = run_id
        self.error = error

    def __str__(self) -> str:
        return f"run {self.run_id} failed: {self.error}"


class OutOfTime(RelayqError, TimeoutError):
    """The turn's time limit passed while these tool calls still ran (`call id: tool`):
    a TimeoutError, retried as one, whose message names them."""

    def __init__(self, running: dict[str, str]) -> None:
        super().__init__(running)
        self.running = dict(running)

    def __str__(self) -> str:
        if not self.running:
            return "the turn ran out of time"
        calls = ", ".join(f"`{tool}` (call {call})" for call, tool in self.running.items())
        return f"the turn ran out of time in tool {calls}"


async def fail_turn(
    rt: Runtime, claim: Claim, error: str, exc: BaseException | None = None
) -> NoReturn:
    """Fail the run saying `error`, and log it once: one line and the user's frames of
    `exc` (`tasks.runner.turn.failures`); Celery adds no traceback of its own (`throws`)."""
    await rt.store.fail_run(claim, error)
    log.error("%s", failure_report(claim.run_id, claim.agent, claim.turns + 1, error, exc))
    raise TurnFailed(claim.run_id, error) from None


def stored_error(exc: BaseException) -> str:
    """The run's stored (and logged) error: the type and a short, redacted message.

    Never the whole text: a database error's holds the SQL and its parameters
    (the transcript, an answer), and any message may hold a key.
    """
    if isinstance(exc, OutOfTime):
        return str(exc)
    if isinstance(exc, TimeoutError):
        return "the turn ran out of time"
    return describe_error(exc)

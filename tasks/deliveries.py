"""One delivery of a turn's task: the task it came in (`TaskRef`) and what it did
(`Delivered`). Apart from `tasks.runner.turn.task`, so that what watches a delivery
(`tasks.observability.metrics`, `tasks.observability.tracing`) needs nothing of the turn's
driver."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from store import OutboxRow
from tasks.hooks import TurnOutcome

if TYPE_CHECKING:
    from celery import Task

    from relayq.loop import Turn

__all__ = ["Delivered", "TaskRef"]


@dataclass(frozen=True)
class TaskRef:
    """The Celery task and the request it serves, kept past the task body's return."""

    task: Task
    request: Any

    @property
    def id(self) -> str:
        return str(self.request.id)

    @property
    def traceparent(self) -> str | None:
        """The trace the message was sent in (`tasks.observability.tracing`), if any."""
        header = getattr(self.request, "traceparent", None)
        return str(header) if header is not None else None


@dataclass(frozen=True)
class Delivered:
    """What one delivery of a turn did: how it ended, a few words for Flower, and, when
    the turn gave its run back to be tried again, the backoff to re-send it after."""

    kind: TurnOutcome
    summary: str
    retry_in: float | None = None
    turn: Turn | None = None
    """The turn taken, when this delivery took one to its end."""
    resend: OutboxRow | None = None
    """The turn's message to send again after `retry_in` (its outbox row, stored)."""

    def __str__(self) -> str:
        return self.summary

    def wire(self) -> dict[str, Any]:
        """This outcome as JSON, for the worker whose child process took the turn
        (`tasks.runner.alone`); the turn itself stays behind (its hooks have heard of it)."""
        resend = self.resend.model_dump(mode="json") if self.resend is not None else None
        return {
            "kind": self.kind.value,
            "summary": self.summary,
            "retry_in": self.retry_in,
            "resend": resend,
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Delivered:
        resend = data.get("resend")
        return cls(
            TurnOutcome(data["kind"]),
            data["summary"],
            data.get("retry_in"),
            resend=OutboxRow.model_validate(resend) if resend is not None else None,
        )

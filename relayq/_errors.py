"""Every error relayq raises derives from one root.

    RelayqError
    ├── ToolkitError      a toolkit could not be built (name clash, bad schema)
    ├── ResumeError       an answer does not fit the halted run it is meant to resume
    ├── RunCancelled      the run was cancelled between two steps
    └── ModelError        the model could not be called; says whether a retry may help

Control flow that is not a failure (a tool asking for approval) is data, not an
exception: see `relayq.pending`.

Each error keeps its structured fields as attributes and passes them all to
`Exception.__init__`, so that pickling (which Celery does when it ships a task's
exception) rebuilds it whole.
"""

from __future__ import annotations

__all__ = ["ModelError", "RelayqError", "ResumeError", "RunCancelled", "ToolkitError"]


class RelayqError(Exception):
    """The root of every error raised by relayq."""


class ToolkitError(RelayqError):
    """A toolkit could not be built from the tools it was given."""

    def __init__(self, message: str, tool: str | None = None) -> None:
        super().__init__(message, tool)
        self.message = message
        self.tool = tool

    def __str__(self) -> str:
        return self.message


class ResumeError(RelayqError):
    """An answer, a pending request or a transcript cannot resume the run."""

    def __init__(self, message: str, request_id: str | None = None) -> None:
        super().__init__(message, request_id)
        self.message = message
        self.request_id = request_id

    def __str__(self) -> str:
        return self.message


class RunCancelled(RelayqError):
    """The run was cancelled; it stopped between two steps."""

    def __init__(self, run_id: str | None = None) -> None:
        super().__init__(run_id)
        self.run_id = run_id

    def __str__(self) -> str:
        return f"run {self.run_id} was cancelled" if self.run_id else "run was cancelled"


class ModelError(RelayqError):
    """The model call failed.

    `retryable` says whether the same call may succeed later (rate limits,
    overload, timeouts); `retry_after` is the server's hint in seconds, if any.
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = False,
        retry_after: float | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message, retryable, retry_after, status)
        self.message = message
        self.retryable = retryable
        self.retry_after = retry_after
        self.status = status
        """The HTTP status the provider answered with, if it answered."""

    def __reduce__(self) -> tuple[object, ...]:
        args = (self.message, self.retryable, self.retry_after, self.status)
        return (_rebuild_model_error, args)

    def __str__(self) -> str:
        return self.message


def _rebuild_model_error(
    message: str, retryable: bool, retry_after: float | None, status: int | None
) -> ModelError:
    return ModelError(message, retryable=retryable, retry_after=retry_after, status=status)

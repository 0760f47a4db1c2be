"""Every error relayq raises derives from one root.

    RelayqError
    ├── ToolkitError      a toolkit could not be built (name clash, bad schema)
    ├── ResumeError       an answer does not fit the halted run it is meant to resume
    │   └── UnstorableAnswer   it holds what the store cannot keep (a NUL, a lone surrogate, ...)
    │       └── AnswerTooLarge     it is over the size limit (RELAYQ_MAX_ANSWER_BYTES)
    ├── UnstorableInput   a new run's prompt (or agent name, conversation id) the store cannot keep
    │   └── InputTooLarge      the prompt is over the size limit
    ├── RunCancelled      the run was cancelled between two steps
    └── ModelError        the model could not be called; says whether a retry may help

Control flow that is not a failure (a tool asking for approval) is data, not an
exception: see `relayq.pending`.

Each error keeps its structured fields as attributes and passes them all to
`Exception.__init__`, so that pickling (which Celery does when it ships a task's
exception) rebuilds it whole.
"""

from __future__ import annotations

__all__ = [
    "AnswerTooLarge",
    "InputTooLarge",
    "ModelError",
    "RelayqError",
    "ResumeError",
    "RunCancelled",
    "ToolkitError",
    "UnstorableAnswer",
    "UnstorableInput",
]


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


class UnstorableAnswer(ResumeError):
    """The answer holds what the store cannot keep; it was refused before anything was written.

    `where` names the place, as a path into the answer's wire form (`data.results[0].output`).
    """

    def __init__(
        self, message: str, request_id: str | None = None, where: str | None = None
    ) -> None:
        super().__init__(message, request_id)
        self.args = (message, request_id, where)
        self.where = where


class AnswerTooLarge(UnstorableAnswer):
    """The answer is over the limit (`RELAYQ_MAX_ANSWER_BYTES`), measured as compact UTF-8 JSON.

    `size` is how many bytes were counted before the check stopped: more than `limit`.
    """

    def __init__(self, request_id: str | None, size: int, limit: int) -> None:
        given = request_id or ""
        shown = repr(request_id) if len(given) <= 80 else repr(given[:80]) + "..."
        super().__init__(
            f"answer to {shown} is over the limit of {limit} bytes of JSON "
            "(RELAYQ_MAX_ANSWER_BYTES); keep large payloads elsewhere and answer with a reference",
            request_id,
        )
        self.args = (request_id, size, limit)
        self.size = size
        self.limit = limit


class UnstorableInput(RelayqError):
    """A new run's prompt, agent name or conversation id holds what the store cannot keep.

    Nothing was written. `where` names the input (`prompt`, `prompts[3]`, `conversation_id`).
    """

    def __init__(self, message: str, where: str | None = None) -> None:
        super().__init__(message, where)
        self.message = message
        self.where = where

    def __str__(self) -> str:
        return self.message


class InputTooLarge(UnstorableInput):
    """A prompt is over the limit (`RELAYQ_MAX_ANSWER_BYTES`, the same as for answers)."""

    def __init__(self, where: str | None, size: int, limit: int) -> None:
        super().__init__(
            f"{where or 'the input'} is over the limit of {limit} bytes (RELAYQ_MAX_ANSWER_BYTES)",
            where,
        )
        self.args = (where, size, limit)
        self.size = size
        self.limit = limit

"""Every error relayq raises derives from one root.

    RelayqError
    ├── ToolkitError         a toolkit could not be built (name clash, bad schema)
    ├── ResumeError          an answer does not fit the halted run it is meant to resume
    │   ├── UnknownRequest       no request has that id (or the run waits on another)
    │   ├── RequestClosed        it takes no answer: `.status` answered, expired or cancelled
    │   ├── AnswerMismatch       unknown or repeated call ids, a wrong echoed id, a bad shape
    │   │   └── CallAnswered         a call that already has a result (partial answers)
    │   ├── ConversationBusy     the conversation has a run that is not finished
    │   ├── ConversationPurged   the conversation's earlier runs were purged: it cannot go on
    │   ├── NotAnApprover        the decider is not in the request's approver groups, or
    │   │                        started the run and the request forbids self-approval
    │   ├── NotAnApproval        a decision on a request that is not an approval (a relay
    │   │                        tool's request takes its calls' results)
    │   ├── AlreadyVoted         the decider has already voted on this request
    │   ├── BulkRefused          a decision on many requests refused whole: `.refused` says why
    │   └── UnstorableAnswer     it holds what the store cannot keep (a NUL, a lone surrogate, ...)
    │       └── AnswerTooLarge       it is over the size limit (RELAYQ_MAX_ANSWER_BYTES)
    ├── UnstorableInput      a new run's prompt, agent name or conversation id the store refuses
    │   └── InputTooLarge        the prompt is over the size limit
    ├── RunCancelled         the run was cancelled between two steps
    ├── ModelError           the model could not be called; says whether a retry may help
    │   └── ProviderDown         its provider's circuit is open: the turn waits, no try spent
    │                            (relayq.circuit; a signal, never shown to a user)
    ├── Throttled            no provider capacity soon enough: the turn waits in its queue
    │                        (relayq.ratelimit; a signal, never shown to a user)
    ├── AgentError           an agent is defined twice, or cannot serve a run (relayq.agents)
    │   └── UnknownAgent         no agent has that name here
    ├── ToolFailure          a builtin's expected failure, made its error result (relayq.builtins)
    │   ├── Missing              no such file
    │   ├── IsFolder             a folder where a file was meant
    │   ├── HardLinked           a file with more than one link, refused
    │   ├── LinkLoop             a symlink loop on the way
    │   └── PatchError           a patch that does not parse or apply
    ├── UnknownRun           no run has that id (store.errors)
    ├── UnknownBatch         no batch has that id (store.batches)
    ├── JobChanged           a batch's rerun changes a job's prompt, or its agent (store.batches)
    ├── JobExists            a run names a job its batch already ran (store.errors)
    ├── UnknownLease         no lease of a relay call has that id (store.leases)
    ├── UnknownGrant         no standing grant has that id (store.grants)
    ├── GrantRefused         a grant that may not be made or revoked: `.forbidden` for who
    │                        asked, else for what it asks (store.grants)
    ├── LeaseLost            a lease that no longer holds its call: `.reason` expired,
    │                        released, superseded, done or ended (store.leases)
    ├── LeaseRefused         another holder's lease, or one of a tool the caller may not
    │                        serve (store.leases)
    ├── BadQuery             a listing's filter, sort, page size or cursor refused (store.paging)
    ├── StaleClaim           a turn lost its claim on its run; it writes nothing (store.errors)
    ├── StoreUnavailable     the store cannot be reached or take the call now; try again
    │   │                    (store.errors: `.address` without a password, `.retry_after`)
    │   └── StoreBusy            SQLite's lock was taken that instant; nothing was done
    ├── IllegalTransition    a run cannot make that status change (store.transitions)
    ├── TurnFailed           a run failed in this turn; the error is stored (tasks.runner.turn.task)
    ├── OutOfTime            a turn's time limit passed; names the tool calls still running
    │                        (a TimeoutError too: tasks.runner.turn.failed)
    ├── ProcessDied          the process running a turn alone ended before it answered
    │                        (tasks.runner.alone)
    ├── AloneError           a turn run alone met an error its process reports by type
    │                        (tasks.runner.alone)
    ├── BadHook              not a RunHooks, or a hook name that does not load (tasks.hooks)
    ├── WaitTimeout          a host waited longer than its timeout for a run (tasks.client.client)
    ├── HostRefused          the API refused a relay host for good: a bad token, a tool it
    │                        may not serve (relayq.hosts)
    ├── MCPError             an MCP server cannot be reached, listed or called: `.server`
    │                        names it (relayq.mcp)
    ├── ExportFailed         `relayq purge --export` could not write a chunk of runs: they
    │                        stay, and the purge stops (cli.purge)
    └── EmbeddedBrokerError  the embedded Redis could not be started (workers.embedded)

The API and the CLI choose a status code and a message from an error's type
alone: UnknownRequest, UnknownRun, UnknownBatch, UnknownAgent, UnknownLease and
UnknownGrant are 404; NotAnApprover, LeaseRefused and a forbidden GrantRefused 403;
RequestClosed, CallAnswered, NotAnApproval, AlreadyVoted, BulkRefused, ConversationBusy,
ConversationPurged, JobChanged, JobExists and LeaseLost 409;
AnswerTooLarge and InputTooLarge 413; every other ResumeError, UnstorableInput,
BadQuery and GrantRefused 422; StoreUnavailable 503, with Retry-After.

Control flow that is not a failure (a tool asking for approval) is data, not an
exception: see `relayq.pending`.

Each error keeps its structured fields as attributes and passes them all to
`Exception.__init__`, so that pickling (which Celery does when it ships a task's
exception) rebuilds it whole.
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "AlreadyVoted",
    "AnswerMismatch",
    "AnswerTooLarge",
    "BulkRefused",
    "CallAnswered",
    "ConversationBusy",
    "ConversationPurged",
    "RequestClosed",
    "UnknownRequest",
    "InputTooLarge",
    "ModelError",
    "NotAnApproval",
    "NotAnApprover",
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


class UnknownRequest(ResumeError):
    """No request has this id (or, in-process, the transcript waits on another)."""

    def __init__(self, request_id: str, message: str | None = None) -> None:
        super().__init__(
            message or f"unknown request id {request_id!r} (never made, or removed with its run)",
            request_id,
        )
        self.args = (request_id, message)


class RequestClosed(ResumeError):
    """The request takes no answer: it is `answered`, `expired` or `cancelled` (`.status`)."""

    def __init__(self, request_id: str, status: str, message: str | None = None) -> None:
        super().__init__(message or f"request {request_id} is already {status}", request_id)
        self.args = (request_id, status, message)
        self.status = status


class AnswerMismatch(ResumeError):
    """The answer does not fit its request: an unknown or repeated call id, an id that does
    not echo the request's, a malformed shape. `call_ids` names the calls at fault."""

    def __init__(
        self, message: str, request_id: str | None = None, call_ids: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message, request_id)
        self.args = (message, request_id, call_ids)
        self.call_ids = call_ids


class CallAnswered(AnswerMismatch):
    """A partial answer names a call that already has a result; nothing was changed."""


class ConversationBusy(ResumeError):
    """The conversation has run `run_id`, still `status`: answer or cancel it first."""

    def __init__(self, conversation_id: str, run_id: str, status: str) -> None:
        super().__init__(
            f"conversation {conversation_id!r} has run {run_id} still {status}; "
            "answer or cancel it before asking again"
        )
        self.args = (conversation_id, run_id, status)
        self.conversation_id = conversation_id
        self.run_id = run_id
        self.status = status


class ConversationPurged(ResumeError):
    """The conversation lost messages to a purge (`relayq purge`, `RELAYQ_RETENTION`) of
    its earlier runs: `kept` of its `written` messages are left, so a run continuing it
    would see half a history. Start a new conversation instead."""

    def __init__(self, conversation_id: str, kept: int, written: int) -> None:
        super().__init__(
            f"conversation {conversation_id!r} keeps {kept} of its {written} messages: its "
            "earlier runs were purged, so it cannot go on; start a new conversation"
        )
        self.args = (conversation_id, kept, written)
        self.conversation_id = conversation_id
        self.kept = kept
        self.written = written


class NotAnApprover(ResumeError):
    """`decider` may not decide this request: not in its approver groups (`why` "group"),
    or the identity that started the run where self-approval is forbidden (`why` "self")."""

    def __init__(self, request_id: str, decider: str, why: str, message: str) -> None:
        super().__init__(message, request_id)
        self.args = (request_id, decider, why, message)
        self.decider = decider
        self.why = why


class NotAnApproval(ResumeError):
    """A decision (approve, edit, decline) on a request that is not an approval: a relay
    tool's request takes its calls' results, never a stock "approved". `kind` is the
    request's. Nothing was changed."""

    def __init__(self, request_id: str, kind: str) -> None:
        super().__init__(
            f"request {request_id} is a {kind} request, not an approval: "
            "it takes an answer, not a decision",
            request_id,
        )
        self.args = (request_id, kind)
        self.kind = kind


class AlreadyVoted(ResumeError):
    """`decider` has already voted on this request; a vote cannot be changed or repeated."""

    def __init__(self, request_id: str, decider: str) -> None:
        super().__init__(f"{decider} has already voted on request {request_id}", request_id)
        self.args = (request_id, decider)
        self.decider = decider


class BulkRefused(ResumeError):
    """A decision on many requests was refused whole, nothing changed: `refused` holds
    `(request_id, why)` for each request that could not take it."""

    def __init__(self, refused: tuple[tuple[str, str], ...]) -> None:
        ids = ", ".join(request_id for request_id, _ in refused[:5])
        more = f" and {len(refused) - 5} more" if len(refused) > 5 else ""
        super().__init__(f"nothing was decided: {len(refused)} request(s) refused it ({ids}{more})")
        self.args = (refused,)
        self.refused = refused


class RunCancelled(RelayqError):
    """The run was cancelled; it stopped between two steps."""

    def __init__(self, run_id: str | None = None) -> None:
        super().__init__(run_id)
        self.run_id = run_id

    def __str__(self) -> str:
        return f"run {self.run_id} was cancelled" if self.run_id else "run was cancelled"


Unanswered = Literal["unreachable", "timeout"]
"""Why a provider sent no status: it could not be reached, or did not answer in time."""


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
        unanswered: Unanswered | None = None,
    ) -> None:
        super().__init__(message, retryable, retry_after, status, unanswered)
        self.message = message
        self.retryable = retryable
        self.retry_after = retry_after
        self.status = status
        """The HTTP status the provider answered with, if it answered."""
        self.unanswered = unanswered
        """Why it did not answer, when the call never got a status back."""

    def __reduce__(self) -> tuple[object, ...]:
        args = (self.message, self.retryable, self.retry_after, self.status, self.unanswered)
        return (_rebuild_model_error, args)

    def __str__(self) -> str:
        return self.message


def _rebuild_model_error(
    message: str,
    retryable: bool,
    retry_after: float | None,
    status: int | None,
    unanswered: Unanswered | None = None,
) -> ModelError:
    return ModelError(
        message, retryable=retryable, retry_after=retry_after, status=status, unanswered=unanswered
    )


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

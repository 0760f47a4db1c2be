"""Errors of the store, under the one relayq root."""

from __future__ import annotations

from relayq import RelayqError

__all__ = [
    "JobExists",
    "StaleClaim",
    "StoreBusy",
    "StoreUnavailable",
    "UnknownRun",
    "safe_text",
]


class UnknownRun(RelayqError):
    """No run has this id."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self.run_id = run_id

    def __str__(self) -> str:
        return f"unknown run id {self.run_id!r} (never made, or removed once finished)"


class JobExists(RelayqError):
    """A run named a batch's job that already has a run: a job runs once in its batch.
    Nothing was started."""

    def __init__(self, batch_id: str, job_ids: list[str]) -> None:
        super().__init__(batch_id, job_ids)
        self.batch_id = batch_id
        self.job_ids = job_ids

    def __str__(self) -> str:
        shown = ", ".join(repr(j) for j in self.job_ids[:5])
        more = f" and {len(self.job_ids) - 5} more" if len(self.job_ids) > 5 else ""
        return (
            f"batch {self.batch_id!r} already has a run of job {shown}{more}; "
            "nothing was started (a job runs once in its batch: give it another job id)"
        )


class StaleClaim(RelayqError):
    """A turn lost its claim on the run (another delivery took it over); it writes nothing."""

    def __init__(self, run_id: str, version: int) -> None:
        super().__init__(run_id, version)
        self.run_id = run_id
        self.version = version

    def __str__(self) -> str:
        return f"run {self.run_id} moved past version {self.version}; this turn lost its claim"


class StoreUnavailable(RelayqError):
    """The store could not be reached or could not take the call now; trying again later may
    succeed: its server is down or restarting, the connection dropped, SQLite's file stayed
    locked past the busy timeout, or a transaction lost a serialization race.

    `address` is the store's URL without its password; `reason` a few words of what
    happened (never the SQL or its parameters); `retry_after` the seconds worth waiting.
    Whatever the call was doing was rolled back, unless the connection dropped while it
    committed: a store call is written so that doing it again is safe.
    """

    def __init__(self, address: str, reason: str, retry_after: float = 1.0) -> None:
        super().__init__(address, reason, retry_after)
        self.address = address
        self.reason = reason
        self.retry_after = retry_after

    def __str__(self) -> str:
        return f"the store at {self.address} is unavailable ({self.reason}); try again shortly"


class StoreBusy(StoreUnavailable):
    """SQLite's write lock was taken by another process at that instant, and the call
    asked not to wait for it (`store.db.impatient`): nothing was done."""


def safe_text(exc: BaseException) -> str:
    """An error as a log may show it: a store outage's own words (its address, never its
    password), else the type alone (a database error's text holds its SQL and parameters)."""
    return str(exc) if isinstance(exc, StoreUnavailable) else type(exc).__name__

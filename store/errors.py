"""Errors of the store, under the one relayq root."""

from __future__ import annotations

from relayq import RelayqError

__all__ = ["StaleClaim", "UnknownRun"]


class UnknownRun(RelayqError):
    """No run has this id."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self.run_id = run_id

    def __str__(self) -> str:
        return f"unknown run id {self.run_id!r}"


class StaleClaim(RelayqError):
    """A turn lost its claim on the run (another delivery took it over); it writes nothing."""

    def __init__(self, run_id: str, version: int) -> None:
        super().__init__(run_id, version)
        self.run_id = run_id
        self.version = version

    def __str__(self) -> str:
        return f"run {self.run_id} moved past version {self.version}; this turn lost its claim"

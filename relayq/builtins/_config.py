"""Which builtin tools a toolkit gets, and their limits."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from relayq._errors import ToolkitError

__all__ = ["BUILTIN_NAMES", "BuiltinsConfig"]

BUILTIN_NAMES: tuple[str, ...] = (
    "bash",
    "read",
    "write",
    "edit",
    "grep",
    "glob",
    "webfetch",
    "question",
    "apply_patch",
    "todowrite",
)


@dataclass(frozen=True, kw_only=True)
class BuiltinsConfig:
    """The builtins to enable (all by default) and the limits they run under."""

    enabled: frozenset[str] = field(default_factory=lambda: frozenset(BUILTIN_NAMES))
    """Names of the enabled builtins."""
    bash_timeout: timedelta = timedelta(seconds=120)
    """A command still running after this is killed with its whole process group."""
    webfetch_timeout: timedelta = timedelta(seconds=30)
    max_output_chars: int = 50_000
    """Longer tool output is cut, with a note saying so."""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.enabled) - set(BUILTIN_NAMES))
        if unknown:
            raise ToolkitError(
                f"unknown builtin(s) {', '.join(unknown)}; the builtins are "
                f"{', '.join(BUILTIN_NAMES)}"
            )

    @classmethod
    def off(cls) -> BuiltinsConfig:
        """No builtins at all."""
        return cls(enabled=frozenset())

    @classmethod
    def only(cls, *names: str) -> BuiltinsConfig:
        """Just the named builtins."""
        return cls(enabled=frozenset(names))

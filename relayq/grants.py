"""Standing grants: an approval given once for calls to come, kept as data.

"Approve, and approve the same for 8 hours in this conversation, up to 20 times" is a
grant: a tool (and agent), a matcher on the arguments (`relayq.matching`), a scope
saying which runs it covers, an expiry and a number of uses. A gated call that no
earlier step of its policy decided (`relayq.policies`) is approved by a grant that
matches it, its use counted in the transaction that approves it; the store keeps,
lists and revokes grants (`store.grants`).

    GrantTerms(scope="conversation", lasts=timedelta(hours=8), max_uses=20)
    GrantTerms(scope="agent", lasts=timedelta(days=7), match=("amount <= 50",))
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, TypeAlias

from relayq._errors import ToolkitError
from relayq.matching import Matcher, parse_constraints

__all__ = [
    "MAX_GRANT_FOR",
    "MAX_USES",
    "SCOPES",
    "GrantCaps",
    "GrantScope",
    "GrantTerms",
    "parse_duration",
    "wider",
]

GrantScope: TypeAlias = Literal["run", "conversation", "principal", "agent", "all"]
SCOPES: tuple[GrantScope, ...] = ("run", "conversation", "principal", "agent", "all")
"""From the narrowest: one run; its conversation; the runs its starter starts; every run of
its agent; every run of any agent with the tool."""
MAX_USES = 1_000_000_000
"""The most calls one grant may approve: a bound the store's integer column holds."""
MAX_GRANT_FOR = timedelta(days=366)
"""The longest a grant may last: a standing approval is reviewed at least yearly."""
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def wider(a: GrantScope, b: GrantScope) -> bool:
    """Whether scope `a` covers more runs than `b`."""
    return SCOPES.index(a) > SCOPES.index(b)


def parse_duration(value: object) -> timedelta:
    """A grant's lifetime: seconds (a number), `"90s"`, `"30m"`, `"8h"`, `"2d"`, `"1w"`,
    or a timedelta. ToolkitError saying what is wrong otherwise."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and (form := _DURATION.match(value)):
        seconds = float(form[1]) * _UNITS[form[2]]
    else:
        raise ToolkitError(
            f"a grant lasts a number of seconds or a duration such as '8h', '30m', '2d'; "
            f"not {value!r}"
        )
    if not 0 < seconds <= MAX_GRANT_FOR.total_seconds():  # false for NaN too
        raise ToolkitError(f"a grant lasts more than nothing and at most {MAX_GRANT_FOR.days} days")
    return timedelta(seconds=seconds)


@dataclass(frozen=True, kw_only=True)
class GrantTerms:
    """What a grant covers and for how long, as a decider or an administrator asks it."""

    scope: GrantScope = "run"
    lasts: timedelta = timedelta(hours=8)
    max_uses: int | None = None
    """None: as many as come before it expires."""
    match: Literal["exact"] | tuple[str, ...] = "exact"
    """`exact`: calls with the very arguments decided; else constraints all calls meet
    (none: every call of the tool)."""

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ToolkitError(f"a grant's scope is one of {', '.join(SCOPES)}, not {self.scope!r}")
        parse_duration(self.lasts)
        if self.max_uses is not None and (
            isinstance(self.max_uses, bool)
            or not isinstance(self.max_uses, int)
            or self.max_uses < 1
        ):
            raise ToolkitError(f"max_uses is a whole number of at least 1, not {self.max_uses!r}")
        if self.match != "exact":
            parse_constraints(list(self.match))

    def matcher(self, arguments: Mapping[str, Any] | None) -> Matcher:
        """The matcher of these terms, for a grant made deciding a call of `arguments`."""
        if self.match == "exact":
            if arguments is None:
                raise ToolkitError("match 'exact' needs the arguments of a decided call")
            return Matcher(arguments=dict(arguments))
        return Matcher(where=parse_constraints(list(self.match)))

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> GrantTerms:
        """From `{scope, for, maxUses | max_uses, match}` (a decision's `grant`)."""
        if not isinstance(wire, Mapping):
            raise ToolkitError("a grant is an object: {scope, for, max_uses, match}")
        known = {"scope", "for", "maxUses", "max_uses", "match"}
        if extra := sorted(set(wire) - known):
            raise ToolkitError(
                f"a grant takes scope, for, max_uses and match; not {', '.join(extra)}"
            )
        if "for" not in wire:
            raise ToolkitError("a grant says how long it lasts: 'for', say '8h'")
        match = wire.get("match", "exact")
        if match != "exact":
            if isinstance(match, str) or not isinstance(match, list):
                raise ToolkitError("a grant's match is 'exact' or a list of constraints")
            match = tuple(match)
        return cls(
            scope=wire.get("scope", "run"),
            lasts=parse_duration(wire["for"]),
            max_uses=wire.get("maxUses", wire.get("max_uses")),
            match=match,
        )


@dataclass(frozen=True, kw_only=True)
class GrantCaps:
    """What a tool's policy lets grants do (`requires_approval(...)`)."""

    grantable: bool = True
    """False: no grant ever approves its calls, and none is made for it."""
    covers_quorum: bool = False
    """A grant stands for a whole quorum (`quorum > 1`); else none is made for such a tool."""
    max_scope: GrantScope = "all"
    max_for: timedelta = MAX_GRANT_FOR

    def __post_init__(self) -> None:
        if self.max_scope not in SCOPES:
            raise ToolkitError(
                f"max_grant_scope is one of {', '.join(SCOPES)}, not {self.max_scope!r}"
            )
        parse_duration(self.max_for)

    def refusal(self, scope: GrantScope, lasts: timedelta, quorum: int) -> str | None:
        """Why a grant of `scope` lasting `lasts` may not stand for this tool; None: it may."""
        if not self.grantable:
            return "the tool's policy takes no grants (grantable=False)"
        if quorum > 1 and not self.covers_quorum:
            return (
                f"the tool needs {quorum} approvals, and its policy lets no grant stand "
                "for them (grant_covers_quorum=False)"
            )
        if wider(scope, self.max_scope):
            return f"the tool's policy lets a grant cover at most scope {self.max_scope!r}"
        if lasts > self.max_for:
            return f"the tool's policy lets a grant last at most {_said(self.max_for)}"
        return None

    def to_wire(self) -> dict[str, Any]:
        return {
            "grantable": self.grantable,
            "grantCoversQuorum": self.covers_quorum,
            "maxGrantScope": self.max_scope,
            "maxGrantFor": self.max_for.total_seconds(),
        }

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> GrantCaps:
        return cls(
            grantable=bool(wire.get("grantable", True)),
            covers_quorum=bool(wire.get("grantCoversQuorum", False)),
            max_scope=wire.get("maxGrantScope", "all"),
            max_for=timedelta(
                seconds=float(wire.get("maxGrantFor", MAX_GRANT_FOR.total_seconds()))
            ),
        )


def _said(lasts: timedelta) -> str:
    seconds = int(lasts.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"

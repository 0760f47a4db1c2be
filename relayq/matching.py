"""Conditions on a tool call's arguments, as data: `amount <= 50`, `currency == "EUR"`.

A policy's deny rules and a standing grant's matcher are written in this small language,
never in Python, so that they can be stored, shown to a person, listed and checked by
any process (the API checks an edit against a tool's deny rules without the tool's code):

    <path> <op> <JSON value>

`path` names an argument, dotted for a nested one (`order.total`); `op` is one of
`==`, `!=`, `<`, `<=`, `>`, `>=`, `in`, `not in`; the value is JSON (`50`, `"EUR"`,
`["EUR", "USD"]`, `true`, `null`). Numbers compare with numbers and strings with strings;
`true` is not `1`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from relayq._errors import ToolkitError

__all__ = [
    "MAX_CONSTRAINTS",
    "Constraint",
    "Matcher",
    "Op",
    "parse_constraint",
    "parse_constraints",
]

Op: TypeAlias = Literal["==", "!=", "<", "<=", ">", ">=", "in", "not in"]
_FORM = re.compile(
    r"^\s*(?P<path>[A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z_][A-Za-z0-9_-]*)*)\s*"
    r"(?P<op>==|!=|<=|>=|<|>|not\s+in\b|in\b)\s*(?P<value>.+?)\s*$"
)
_MISSING = object()
MAX_CONSTRAINTS = 32
"""Constraints a matcher or a rule list may hold: enough for a policy, small enough to
show a person whole."""


@dataclass(frozen=True)
class Constraint:
    """One condition on the arguments: `amount <= 50`."""

    path: tuple[str, ...]
    op: Op
    value: Any

    def __str__(self) -> str:
        return f"{'.'.join(self.path)} {self.op} {json.dumps(self.value)}"

    def holds(self, arguments: Mapping[str, Any]) -> bool | None:
        """Whether the arguments meet it; None when it can't be told (an order between
        values of different kinds, or of an argument that is absent)."""
        found = _at(arguments, self.path)
        if self.op in ("==", "!="):
            same = found is not _MISSING and _same(found, self.value)
            return same if self.op == "==" else not same
        if self.op in ("in", "not in"):
            inside = found is not _MISSING and any(_same(found, v) for v in self.value)
            return inside if self.op == "in" else not inside
        if found is _MISSING or _kind(found) != _kind(self.value) or _kind(found) == "other":
            return None
        if self.op == "<":
            return bool(found < self.value)
        if self.op == "<=":
            return bool(found <= self.value)
        if self.op == ">":
            return bool(found > self.value)
        return bool(found >= self.value)


def parse_constraint(text: str) -> Constraint:
    """The constraint `text` writes; ToolkitError saying what is wrong otherwise."""
    if not isinstance(text, str):
        raise ToolkitError(f"a constraint is a string such as 'amount <= 50', not {text!r}")
    form = _FORM.match(text)
    if form is None:
        raise ToolkitError(
            f"{text!r} is not a constraint: write '<argument> <op> <JSON value>', "
            "op one of ==, !=, <, <=, >, >=, in, not in (say 'amount <= 50')"
        )
    op = " ".join(form["op"].split())
    try:
        value = json.loads(form["value"])
    except json.JSONDecodeError:
        raise ToolkitError(
            f"in {text!r}, {form['value']!r} is not a JSON value (strings take double quotes)"
        ) from None
    if op in ("in", "not in") and not isinstance(value, list):
        raise ToolkitError(f"in {text!r}, {op} takes a JSON list")
    if op in ("<", "<=", ">", ">=") and _kind(value) not in ("number", "string"):
        raise ToolkitError(f"in {text!r}, {op} compares with a number or a string")
    return Constraint(path=tuple(form["path"].split(".")), op=op, value=value)  # type: ignore[arg-type]


def parse_constraints(texts: Sequence[str] | str) -> tuple[Constraint, ...]:
    """Several constraints, each checked; at most MAX_CONSTRAINTS."""
    if isinstance(texts, str):
        texts = [texts]
    if len(texts) > MAX_CONSTRAINTS:
        raise ToolkitError(f"at most {MAX_CONSTRAINTS} constraints, not {len(texts)}")
    return tuple(parse_constraint(t) for t in texts)


@dataclass(frozen=True)
class Matcher:
    """Which calls a grant covers: these exact arguments, or every call meeting all the
    constraints (no constraints: every call of the tool)."""

    arguments: dict[str, Any] | None = None
    where: tuple[Constraint, ...] = ()

    def __post_init__(self) -> None:
        if self.arguments is not None and self.where:
            raise ToolkitError("a matcher takes exact arguments or constraints, not both")

    def matches(self, arguments: Mapping[str, Any]) -> bool:
        if self.arguments is not None:
            return _same(dict(arguments), self.arguments)
        return all(c.holds(arguments) is True for c in self.where)

    def to_wire(self) -> dict[str, Any]:
        if self.arguments is not None:
            return {"arguments": self.arguments}
        return {"where": [str(c) for c in self.where]}

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any] | None) -> Matcher:
        if not wire:
            return cls()
        if "arguments" in wire:
            arguments = wire["arguments"]
            if not isinstance(arguments, dict):
                raise ToolkitError("a matcher's arguments are a JSON object")
            return cls(arguments=arguments)
        return cls(where=parse_constraints(list(wire.get("where") or ())))

    def __str__(self) -> str:
        if self.arguments is not None:
            return f"arguments = {json.dumps(self.arguments, sort_keys=True)}"
        return " and ".join(map(str, self.where)) or "any arguments"


def _at(arguments: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    found: Any = arguments
    for part in path:
        if not isinstance(found, Mapping) or part not in found:
            return _MISSING
        found = found[part]
    return found


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "other"


def _same(a: Any, b: Any) -> bool:
    """JSON equality: `true` is not `1`, `1` is `1.0`."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if _kind(a) != _kind(b):
        return False
    return bool(a == b)

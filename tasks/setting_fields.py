"""How one setting is declared and read: a dataclass field that names its variable
(`option`), the parsers of its value, and its source (`Source`: the environment, then a
Celery configuration). `tasks.settings` declares every setting with these."""

from __future__ import annotations

import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field, fields
from datetime import timedelta
from typing import Any, TypeVar

from relayq import limits
from store.paging import BadQuery
from store.request_terms import age_of

__all__ = [
    "CONF_PREFIX",
    "ENV_PREFIX",
    "WORKER_BATCHES",
    "Option",
    "Parse",
    "Source",
    "age",
    "answer_bytes",
    "count",
    "names",
    "option",
    "read_fields",
    "shown_default",
    "text",
    "worker_batches",
]

ENV_PREFIX = "RELAYQ_"
CONF_PREFIX = "relayq_"

T = TypeVar("T")
Parse = Callable[[str, Any], Any]
"""(where the value was found, the raw value) -> the setting; ValueError naming `where`."""


def text(_: str, value: Any) -> str:
    return str(value)


def _flag(_: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def count(minimum: int) -> Parse:
    def parse(key: str, value: Any) -> int:
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{key} must be a whole number, not {value!r}") from None
        if isinstance(value, bool | float) or number < minimum:
            raise ValueError(f"{key} must be a whole number of at least {minimum}, not {value!r}")
        return number

    return parse


def _duration(key: str, value: Any) -> timedelta:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    else:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{key} must be a number of seconds, not {value!r}") from None
    if seconds <= 0:
        raise ValueError(f"{key} must be more than 0 seconds, not {value!r}")
    return timedelta(seconds=seconds)


def age(key: str, value: Any) -> timedelta | None:
    """An age as listings read one (`30d`, `12h`, `90m`, `1w`: `store.request_terms`), or
    seconds; `off` (or 0) for none."""
    raw = str(value).strip().lower()
    if raw in ("off", "none", "0"):
        return None
    try:
        read = age_of(f"{raw}s" if raw.isdigit() else raw, key)
    except BadQuery:
        read = timedelta(0)
    if read <= timedelta(0):
        raise ValueError(
            f"{key} must be an age such as 30d, 12h or 90m (at most a century), or off; "
            f"not {value!r}"
        )
    return read


_UNITS = {"": 2**20, "k": 2**10, "kib": 2**10, "kb": 10**3, "m": 2**20, "mib": 2**20, "mb": 10**6}
_UNITS |= {"g": 2**30, "gib": 2**30, "gb": 10**9}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]*)")


def memory(key: str, value: Any) -> int | None:
    """A size in bytes from `512MiB`, `2GiB`, `800MB` (a plain number: MiB), at least
    16 MiB and at most a PiB; `off` (or 0) for none."""
    raw = str(value).strip().lower()
    if raw in ("off", "none", "0"):
        return None
    match = _SIZE.fullmatch(raw)
    unit = _UNITS.get(match.group(2)) if match else None
    size = int(float(match.group(1)) * unit) if match and unit else 0
    if not 16 * 2**20 <= size <= 2**50:
        raise ValueError(
            f"{key} must be a size such as 512MiB or 2GiB (at least 16MiB), or off; not {value!r}"
        )
    return size


def names(_: str, value: Any) -> tuple[str, ...]:
    return tuple(n.strip() for n in str(value).split(",") if n.strip())


def answer_bytes(_: str, value: Any) -> int:
    return limits.max_answer_bytes({limits.MAX_ANSWER_BYTES_ENV: str(value)})


WORKER_BATCHES = ("serve", "skip", "only")
"""What a worker does with the batch queues (`store.batch_queues`) of the queues it is told
to consume (`-Q`): consume them beside those queues, never, or instead of those queues."""


def worker_batches(key: str, value: Any) -> str:
    mode = str(value).strip().lower()
    if mode not in WORKER_BATCHES:
        raise ValueError(f"{key} must be serve, skip or only, not {value!r}")
    return mode


_BY_TYPE: dict[Any, Parse] = {
    str: text,
    bool: _flag,
    int: count(0),
    timedelta: _duration,
}


def option(
    name: str, *, parse: Parse | None = None, shown: str | None = None, **default: Any
) -> Any:
    """A field that is a setting: read as `RELAYQ_<NAME>` / `relayq_<name>`, parsed by its
    type unless `parse` says otherwise; `shown`: its default as the docs write it, where
    the value is not the default itself (derived from others, or per pool)."""
    return field(**default, metadata={"option": name, "parse": parse, "shown": shown})


@dataclass(frozen=True)
class Option:
    """One setting as the docs list it: its variable and its default as written there."""

    variable: str
    default: str
    path: str
    """Where it is read: `turns.time_limit`."""


class Source:
    """One setting's raw value: the environment's, else the configuration's, else None."""

    def __init__(self, env: Mapping[str, str], conf: Mapping[str, Any] | None) -> None:
        self.env = env
        self.conf = conf if conf is not None else {}

    def raw(self, name: str) -> tuple[str, Any] | None:
        """(where it was found, the value), for `name` like `turn_time_limit`."""
        key = ENV_PREFIX + name.upper()
        value: Any = self.env.get(key)
        if value is not None and value != "":
            return key, value
        key = CONF_PREFIX + name
        value = self.conf.get(key)
        if value is not None and value != "":
            return key, value
        return None

    def value(self, name: str, default: T, parse: Callable[[str, Any], T]) -> T:
        found = self.raw(name)
        return default if found is None else parse(*found)


def read_fields(group: type, src: Source, *, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The group's settings that are set, parsed: the rest keep their field's default."""
    hints = typing.get_type_hints(group)
    found: dict[str, Any] = {}
    for f in fields(group):
        name = f.metadata.get("option")
        if name is None or f.name in skip:
            continue
        parse = f.metadata["parse"] or _BY_TYPE[hints[f.name]]
        raw = src.raw(name)
        if raw is not None:
            found[f.name] = parse(*raw)
    return found


def shown_default(f: Field[Any]) -> str:
    """A setting's default as the docs write it."""
    if f.metadata["shown"] is not None:
        return str(f.metadata["shown"])
    default = f.default  # a setting's field always has one (`option`)
    if isinstance(default, bool):
        return "1" if default else "0"
    if isinstance(default, timedelta):
        return f"{default.total_seconds():g}"
    if default in (None, "", ()):
        return ""
    return str(default)

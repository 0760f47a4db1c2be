"""What relayq takes in, and what it lets out.

In: an answer or a prompt is checked against everything the store would
refuse, before anything is written. PostgreSQL's text columns refuse NUL
characters, and no database driver can encode a lone surrogate (a Python str
that is not valid UTF-8); a value that is not JSON cannot be stored as JSON.
Each would be accepted and then fail the run later, where it is written.

    check_answer(answer)                    # UnstorableAnswer / AnswerTooLarge (ResumeErrors)
    check_run_input(agent="a", prompts=[p]) # UnstorableInput / InputTooLarge

Sizes are bytes of compact UTF-8 JSON, at most `RELAYQ_MAX_ANSWER_BYTES`
(default 1 MiB: an answer is a tool result the model reads on every later
turn, and 1 MiB is about 250k tokens, more than any model's context window).

Out: an error's text goes into the run's stored error (which every viewer can
read) and into logs, so it is cut short, made storable, and stripped of
anything shaped like a key and of text the request itself carried.

    redact_secrets("key sk-abc123def456")   # "key [redacted]"
    describe_error(exc)                     # "DataError: (psycopg.DataError) ..." without SQL
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from relayq._errors import (
    AnswerTooLarge,
    InputTooLarge,
    RelayqError,
    UnstorableAnswer,
    UnstorableInput,
)
from relayq._types import Answer

__all__ = [
    # limits
    "DEFAULT_MAX_ANSWER_BYTES",
    "MAX_ANSWER_BYTES_ENV",
    "MAX_DEPTH",
    "max_answer_bytes",
    # checks
    "check_answer",
    "check_run_input",
    "problem_of",
    # errors
    "AnswerTooLarge",
    "InputTooLarge",
    "UnstorableAnswer",
    "UnstorableInput",
    # text that goes out
    "ERROR_TEXT_LIMIT",
    "describe_error",
    "redact_secrets",
    "safe_text",
    "without_echoes",
]

DEFAULT_MAX_ANSWER_BYTES = 1 << 20
MAX_ANSWER_BYTES_ENV = "RELAYQ_MAX_ANSWER_BYTES"
MAX_DEPTH = 64
"""Nesting deeper than this in an answer's data is refused (JSON encoders recurse)."""
ERROR_TEXT_LIMIT = 300
"""Characters of an error's message kept in a stored run error or a log line."""


def max_answer_bytes(env: Mapping[str, str] | None = None) -> int:
    """`RELAYQ_MAX_ANSWER_BYTES` from `env` (default: the process environment), else 1 MiB."""
    raw = (os.environ if env is None else env).get(MAX_ANSWER_BYTES_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_ANSWER_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"{MAX_ANSWER_BYTES_ENV} must be a positive number of bytes, not {raw!r}")
    return value


# -- what the store cannot keep -----------------------------------------------------------------

_SURROGATE = re.compile("[\ud800-\udfff]")


def problem_of(text: str) -> str | None:
    """Why `text` cannot be stored (a NUL character, a lone surrogate), or None if it can."""
    nul = text.find("\x00")
    if nul >= 0:
        return f"holds a NUL character (\\x00) at position {nul}, which the store cannot keep"
    bad = _SURROGATE.search(text)
    if bad is not None:
        return (
            f"holds a lone surrogate (\\u{ord(bad.group()):04x}) at position {bad.start()}: "
            "it is not valid UTF-8"
        )
    return None


class _Refusal(Exception):
    def __init__(self, where: str, problem: str) -> None:
        super().__init__(where, problem)
        self.where = where
        self.problem = problem


class _OverLimit(Exception):
    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


class _Scan:
    """One walk over a JSON value: refuses what cannot be stored, and counts its bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0

    def add(self, n: int) -> None:
        self.size += n
        if self.size > self.limit:
            raise _OverLimit(self.size)  # stop here: the rest need not be read

    def text(self, value: str, where: str) -> None:
        if len(value) > self.limit:  # over at once: never read the rest of a huge string
            self.add(len(value) + 2)
        problem = problem_of(value)
        if problem is not None:
            raise _Refusal(where, problem)
        encoded = json.dumps(value, ensure_ascii=False)  # exact, and no longer than the limit
        self.add(len(encoded) if encoded.isascii() else len(encoded.encode()))

    def value(self, value: Any, where: str, depth: int = 0) -> None:
        if isinstance(value, str):
            self.text(value, where)
        elif value is None or isinstance(value, bool):
            self.add(4 if value in (None, True) else 5)
        elif isinstance(value, int):
            self.add(len(_number(value, where)))
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise _Refusal(where, f"is {value}, which JSON cannot hold")
            self.add(len(repr(value)))
        elif isinstance(value, Mapping | list | tuple):
            if depth >= MAX_DEPTH:
                raise _Refusal(where, f"nests deeper than {MAX_DEPTH} levels")
            self.container(value, where, depth + 1)
        else:
            raise _Refusal(where, f"is a {type(value).__name__}, not a JSON value")

    def container(self, value: Mapping[Any, Any] | Sequence[Any], where: str, depth: int) -> None:
        self.add(2)
        if isinstance(value, Mapping):
            for n, (key, item) in enumerate(value.items()):
                if not isinstance(key, str):
                    raise _Refusal(where, f"has a key {key!r} that is not a string")
                inner = f"{where}.{key}" if _PLAIN_KEY.fullmatch(key) else f"{where}[{_shown(key)}]"
                self.text(key, f"a key of {where}" if where else "a key")
                inner = inner.removeprefix(".")
                self.add(1 + (n > 0))
                self.value(item, inner, depth)
        else:
            for n, item in enumerate(value):
                self.add(n > 0)
                self.value(item, f"{where}[{n}]", depth)


_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,40}")


def _shown(text: str, most: int = 40) -> str:
    """`text` quoted for a message, cut to `most` characters: a message never grows with input."""
    return repr(text) if len(text) <= most else repr(text[:most]) + "..."


def _number(value: int, where: str) -> str:
    try:
        return str(value)
    except ValueError:  # more digits than Python will print (sys.get_int_max_str_digits)
        raise _Refusal(where, "is an integer too large to write as JSON") from None


def check_answer(
    answer: Answer, *, answered_by: str | None = None, max_bytes: int | None = None
) -> None:
    """Refuse, before anything is written, an answer the store could not keep.

    UnstorableAnswer names where it holds a NUL character, a lone surrogate, a
    NaN, a value that is not JSON, or nesting deeper than `MAX_DEPTH`;
    AnswerTooLarge when it is over `max_bytes` (default: `max_answer_bytes()`)
    of compact UTF-8 JSON. `answered_by` is checked too: it is stored as text.
    """
    limit = max_answer_bytes() if max_bytes is None else max_bytes
    wire = {"id": answer.id, "ok": answer.ok, "data": answer.data, "reason": answer.reason}
    try:
        # The answer itself is no level of nesting: its data is the first.
        _Scan(limit).value({k: v for k, v in wire.items() if v is not None}, "", depth=-1)
        if answered_by is not None:
            _Scan(limit).text(answered_by, "answered_by")
    except _Refusal as bad:
        where = bad.where if len(bad.where) <= 200 else "..." + bad.where[-197:]
        raise UnstorableAnswer(
            f"answer to {_shown(answer.id, 80)} refused: {where} {bad.problem}", answer.id, where
        ) from None
    except _OverLimit as over:
        raise AnswerTooLarge(answer.id, over.size, limit) from None


def check_run_input(
    *,
    agent: str,
    prompts: Sequence[str],
    conversation_id: str | None = None,
    max_bytes: int | None = None,
) -> None:
    """Refuse, before anything is written, prompts (and names) the store could not keep.

    UnstorableInput names the prompt (`prompt`, or `prompts[i]` of several) or
    field; InputTooLarge when a prompt is over `max_bytes` (default:
    `max_answer_bytes()`) as UTF-8 JSON.
    """
    limit = max_answer_bytes() if max_bytes is None else max_bytes
    named = [("agent", agent), ("conversation_id", conversation_id)]
    if len(prompts) == 1:
        named.append(("prompt", prompts[0]))
    else:
        named += [(f"prompts[{n}]", p) for n, p in enumerate(prompts)]
    for where, value in named:
        if value is None:
            continue
        if not isinstance(value, str):
            raise UnstorableInput(f"{where} must be a string, not {type(value).__name__}", where)
        try:
            _Scan(limit).text(value, where)
        except _Refusal as bad:
            raise UnstorableInput(f"{where} refused: it {bad.problem}", where) from None
        except _OverLimit as over:
            raise InputTooLarge(where, over.size, limit) from None


# -- what may go out ----------------------------------------------------------------------------

_KEY_SHAPED = re.compile(
    r"(?i)(bearer\s+)[^\s\"']+"  # a bearer token, whatever its shape
    r"|\bsk-[A-Za-z0-9_\-]{6,}"  # OpenAI / Anthropic style keys
    # A long random-looking token: letters and digits mixed, 24 characters or more.
    r"|(?<![A-Za-z0-9_\-+=])(?=[A-Za-z0-9_\-+=]*\d)(?=[A-Za-z0-9_\-+=]*[A-Za-z])"
    r"[A-Za-z0-9_\-+=]{24,}"
)
_RELAYQ_ID = re.compile(r"[a-z]+_[0-9a-f]{32}")
"""relayq's own ids (`run_<hex>`): random, but no secret, and an error needs them."""
REDACTED = "[redacted]"


def redact_secrets(text: str, *secrets: str | None) -> str:
    """`text` with each given secret, bearer token, `sk-...` key and long random token replaced."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)

    def hide(m: re.Match[str]) -> str:
        if m.group(1):
            return m.group(1) + REDACTED
        return m.group() if _RELAYQ_ID.fullmatch(m.group()) else REDACTED

    return _KEY_SHAPED.sub(hide, text)


ECHO = 12
"""A run of this many characters shared with the request counts as an echo of it."""
ECHOED = "[request text]"


def without_echoes(text: str, sources: Iterable[str]) -> str:
    """`text` with whatever it quotes of `sources` (the request's messages) replaced.

    A source quoted whole, or any run of 17 characters or more of one (also as
    JSON-escaped text), becomes `[request text]`.
    """
    forms: list[str] = []
    for source in sources:
        if len(source) < 8:
            continue
        escaped = (json.dumps(source)[1:-1], json.dumps(source, ensure_ascii=False)[1:-1])
        forms += dict.fromkeys((source, *escaped))  # each form once, in this order
    for form in sorted(forms, key=len, reverse=True):
        if form in text:
            text = text.replace(form, ECHOED)
    haystack = "\x00".join(f for f in forms if len(f) >= ECHO)
    if not haystack:
        return text
    out, at = [], 0
    for start, end in _echoed_spans(text, haystack):
        out += [text[at:start], ECHOED]
        at = end
    out.append(text[at:])
    return "".join(out)


def _echoed_spans(text: str, haystack: str) -> list[tuple[int, int]]:
    """The runs of `text` found in `haystack`, each grown to its full length.

    Anchors every ECHO // 2 characters keep the `in` tests few even against a
    long transcript: any shared run of ECHO + ECHO // 2 - 1 characters holds one.
    """
    spans: list[tuple[int, int]] = []
    i = 0
    while i + ECHO <= len(text):
        if text[i : i + ECHO] not in haystack:
            i += ECHO // 2
            continue
        start, end = _widest(text, haystack, i, i + ECHO)
        if spans and start <= spans[-1][1]:
            start = spans.pop()[0]
        spans.append((start, end))
        i = end
    return spans


def _widest(text: str, haystack: str, start: int, end: int) -> tuple[int, int]:
    """How far the shared run `text[start:end]` reaches to the left, and to the right."""
    left = _grow(lambda n: text[end - n : end] in haystack, end - start, end)
    right = _grow(lambda n: text[start : start + n] in haystack, end - start, len(text) - start)
    return end - left, start + right


def _grow(fits: Callable[[int], bool], good: int, most: int) -> int:
    """The largest n in [good, most] with fits(n), given fits(good) and that fits only shrinks:
    doubling steps, then halving, so a long echo costs a few tests, not one per character."""
    step = 1
    while good + step <= most and fits(good + step):
        good += step
        step *= 2
    bad = min(good + step, most + 1)
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good


def safe_text(text: str, *, limit: int = ERROR_TEXT_LIMIT) -> str:
    """`text` as it may be stored and logged: one line, keys redacted, NULs and lone
    surrogates replaced, at most `limit` characters."""
    line = " ".join(redact_secrets(text).split())
    line = _SURROGATE.sub("\ufffd", line.replace("\x00", "\\x00"))
    return line if len(line) <= limit else line[: limit - 3] + "..."


_SQL = re.compile(r"\s*\[(SQL|parameters):")


def describe_error(exc: BaseException) -> str:
    """What may be stored as a failed run's error: the type and a short, redacted message.

    A database error's text holds the SQL statement and its parameters (the
    transcript, an answer); only its first line is kept, and never the SQL.
    relayq's own errors build their own messages and keep them without the type.
    """
    text = str(exc)
    first = _SQL.split(text.strip().split("\n", 1)[0], maxsplit=1)[0].strip() if text else ""
    if isinstance(exc, RelayqError):
        return safe_text(first or type(exc).__name__)
    name = type(exc).__name__
    return safe_text(f"{name}: {first}" if first else name)

"""One error root, a tree that lists every class, and status codes chosen by type alone."""

from __future__ import annotations

import ast
import builtins
import inspect
import pickle
from pathlib import Path

import pytest

import relayq
from api._errors import status_of
from relayq import (
    AgentError,
    AnswerMismatch,
    AnswerTooLarge,
    CallAnswered,
    ConversationBusy,
    ConversationPurged,
    InputTooLarge,
    RelayqError,
    RequestClosed,
    ResumeError,
    UnknownAgent,
    UnknownRequest,
    UnstorableAnswer,
    UnstorableInput,
)
from relayq import _errors as errors_module
from store import StaleClaim, StoreUnavailable, UnknownRun
from store.leases import LeaseLost, UnknownLease

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("relayq", "store", "tasks", "workers", "api", "cli")
BUILTIN = {name for name, value in vars(builtins).items() if inspect.isclass(value)
           and issubclass(value, BaseException)}  # fmt: skip


def project_exceptions() -> dict[str, str]:
    """Every public exception class the project defines, to its base's name (read, not run)."""
    bases: dict[str, str] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and node.bases:
                    base = node.bases[0]
                    name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
                    bases[node.name] = name

    def is_error(name: str, seen: int = 0) -> bool:
        if name in BUILTIN:
            return True
        return seen < 20 and name in bases and is_error(bases[name], seen + 1)

    return {n: b for n, b in bases.items() if not n.startswith("_") and is_error(n)}


def root_of(name: str, found: dict[str, str]) -> str:
    while name in found:
        name = found[name]
    return name


def test_every_error_of_the_project_derives_from_relayq_error():
    found = project_exceptions()
    outside = sorted(n for n in found if n != "RelayqError" and root_of(n, found) != "Exception")
    assert "RelayqError" in found
    assert outside == [], "these do not derive from RelayqError"
    assert all(found[n] != "Exception" for n in found if n != "RelayqError"), (
        "only RelayqError derives from Exception directly"
    )


def test_the_error_tree_in_the_docstring_lists_every_class_under_its_parent():
    doc = errors_module.__doc__ or ""
    lines = [line for line in doc.splitlines() if "── " in line]
    drawn: dict[str, str] = {}
    for index, line in enumerate(lines):
        name, depth = line.split("── ")[-1].split()[0], line.index("── ")
        up = next((t for t in reversed(lines[:index]) if t.index("── ") == depth - 4), None)
        drawn[name] = up.split("── ")[-1].split()[0] if up else "RelayqError"
    found = project_exceptions()
    assert sorted(drawn) == sorted(n for n in found if n != "RelayqError")
    for name, parent in drawn.items():
        assert found[name] == parent, f"{name} is drawn under {parent}, not {found[name]}"


ERRORS = [
    UnknownRequest("req_1"),
    RequestClosed("req_1", "expired"),
    AnswerMismatch("bad", "req_1", ("c1",)),
    CallAnswered("twice", "req_1", ("c1",)),
    ConversationBusy("conv", "run_1", "pending"),
    ConversationPurged("conv", 3, 8),
    UnstorableAnswer("nul", "req_1", "data.output"),
    AnswerTooLarge("req_1", 10, 5),
    UnstorableInput("nul", "prompt"),
    InputTooLarge("prompt", 10, 5),
    UnknownAgent("nobody", ("a", "b")),
    UnknownRun("run_1"),
    UnknownLease("lease_1"),
    LeaseLost("lease_1", "expired", "lease lease_1 of call c1 expired"),
    StaleClaim("run_1", 3),
    StoreUnavailable("postgresql+psycopg://relayq:***@db:5432/relayq", "connection refused", 2.0),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_each_error_survives_pickling_whole(error: RelayqError):
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error)
    assert str(again) == str(error)
    assert vars(again) == vars(error)


def test_the_subclasses_keep_their_bases_and_structured_fields():
    assert all(
        issubclass(cls, ResumeError)
        for cls in (UnknownRequest, RequestClosed, AnswerMismatch, ConversationBusy)
    )
    assert issubclass(UnknownAgent, AgentError)
    assert RequestClosed("r", "cancelled").status == "cancelled"
    assert ConversationBusy("c", "run_9", "running").run_id == "run_9"
    assert CallAnswered("x", "r", ("c1", "c2")).call_ids == ("c1", "c2")
    assert {"UnknownRequest", "RequestClosed", "AnswerMismatch", "ConversationBusy",
            "UnknownAgent"} <= set(relayq.__all__)  # fmt: skip


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (UnknownRequest("r"), 404),
        (UnknownRun("r"), 404),
        (UnknownAgent("a"), 404),
        (RequestClosed("r", "answered"), 409),
        (CallAnswered("x", "r"), 409),
        (ConversationBusy("c", "r", "pending"), 409),
        (ConversationPurged("c", 3, 8), 409),
        (UnknownLease("l"), 404),
        (LeaseLost("l", "released", "released"), 409),
        (AnswerTooLarge("r", 2, 1), 413),
        (InputTooLarge("prompt", 2, 1), 413),
        (AnswerMismatch("x", "r"), 422),
        (UnstorableAnswer("x", "r"), 422),
        (UnstorableInput("x"), 422),
        (ResumeError("x"), 422),
        (StaleClaim("r", 1), 500),
        (StoreUnavailable("sqlite:///x.db", "the database file is locked"), 503),
    ],
)
def test_the_api_picks_its_status_from_the_type_alone(error: RelayqError, status: int):
    assert status_of(error) == status

"""The inbox benchmark's store (`bench.inbox`): open requests seeded in bulk as
`store.requests.open_request` writes them, relay calls with their arguments and tool
approvals with a policy naming approver groups, each waiting run beside its request."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import insert, text

from relayq import Request
from relayq.approvals import APPROVAL_KIND, Policy
from relayq.relay import RelayCall, relay_request
from store import Database, RequestRow, RunRow, migrate

__all__ = ["AGENTS", "GROUPS", "REASONS", "TOOLS", "seed", "seed_rows"]

AGENTS = ("support", "billing", "ops", "research", "sales")
GROUPS = ("finance", "ops", "security", "legal")
REASONS = (
    "parcel arrived damaged",
    "charged twice for the same order",
    "subscription cancelled last month",
    "item never arrived",
    "wrong size sent",
)


def _arguments(tool: str, n: int, rng: random.Random) -> dict[str, Any]:
    """A few fields, as a model would fill them in for `tool`."""
    order = f"ord_{rng.randrange(10**7):07d}"
    if tool == "refund":
        return {
            "order_id": order,
            "amount": round(rng.uniform(5, 900), 2),
            "currency": rng.choice(("EUR", "USD", "GBP")),
            "reason": rng.choice(REASONS),
        }
    if tool == "send_email":
        return {
            "to": f"customer{n}@example.com",
            "subject": f"About your order {order}",
            "body": f"Hello, we looked into your order {order}: {rng.choice(REASONS)}.",
        }
    if tool == "update_ticket":
        return {"ticket": f"T-{n:06d}", "status": rng.choice(("pending", "solved")), "note": ""}
    return {
        "service": rng.choice(("checkout", "search", "billing-api")),
        "version": f"2.{rng.randrange(40)}.{rng.randrange(10)}",
        "region": rng.choice(("eu-west-1", "us-east-1")),
    }


TOOLS = {
    "refund": "Refund an order",
    "send_email": "Send an email to a customer",
    "update_ticket": "Change a support ticket",
    "deploy": "Deploy a service",
}


def _schema(arguments: dict[str, Any]) -> dict[str, Any]:
    kinds = {str: "string", float: "number", int: "integer"}
    properties = {k: {"type": kinds[type(v)]} for k, v in arguments.items()}
    return {"type": "object", "properties": properties, "required": list(arguments)}


# A row's every column at its model's default: SQLModel rows are slow to build, 20,000 of
# them take seconds, so each seeded row is this template with its own values over it.
_EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
_REQUEST = RequestRow(id="", run_id="", agent="", kind="", prompt="", created_at=_EPOCH)
_RUN = RunRow(id="", agent="", conversation_id="", status="", created_at=_EPOCH, updated_at=_EPOCH)
REQUEST_DEFAULTS, RUN_DEFAULTS = _REQUEST.model_dump(), _RUN.model_dump()

_WHY = (
    "The customer has written twice and waits for an answer today.",
    "Above the amount the agent may decide alone; a second look is policy.",
    "Flagged by the fraud check last week, so a person decides.",
)


def _approval(n: int, agent: str, rng: random.Random) -> dict[str, Any]:
    """A tool approval's columns, those `open_request` fills in from its policy included."""
    tool = rng.choice(list(TOOLS))
    args = _arguments(tool, n, rng)
    groups = tuple(rng.sample(GROUPS, rng.choice((1, 1, 2))))
    policy = Policy(approvers=groups, quorum=rng.choice((1, 1, 1, 2)))
    shown = ", ".join(f"{k}={v}" for k, v in args.items())
    prompt = f"{agent}: {TOOLS[tool].lower()} for case #{n:06d} ({shown}). {rng.choice(_WHY)}"
    data = {"tool": tool, "arguments": args, "schema": _schema(args), "policy": policy.to_wire()}
    request = Request(kind=APPROVAL_KIND, prompt=prompt[:240], data=data)
    return _common(request) | {
        "data": request.data,
        "calls": [],
        "tool": tool,
        "approvers": list(policy.approvers),
        "quorum": policy.quorum,
        "escalation": [],
    }


def _relay(n: int, rng: random.Random) -> dict[str, Any]:
    """A relay request's columns: one or two calls the host runs, as `relay_request` has them."""
    calls = []
    for i in range(rng.choice((1, 1, 1, 2))):
        tool = rng.choice(list(TOOLS))
        args = _arguments(tool, n, rng)
        calls.append(
            RelayCall(id=f"call_{n}_{i}", name=tool, input=args, arguments=json.dumps(args))
        )
    request = relay_request(calls)
    return _common(request) | {
        "data": {},
        "calls": [c.model_dump(mode="json") for c in calls],
        "tool": calls[0].name,
    }


def _common(request: Request) -> dict[str, Any]:
    return REQUEST_DEFAULTS | {"id": request.id, "kind": request.kind, "prompt": request.prompt}


def seed_rows(count: int, *, seed: int = 7) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`count` waiting runs and their open requests (three in five approvals), oldest first,
    one a minute up to now, as column values for one bulk insert each."""
    rng = random.Random(seed)
    now = datetime.now(UTC)
    runs: list[dict[str, Any]] = []
    requests: list[dict[str, Any]] = []
    for n in range(count):
        created = now - timedelta(minutes=count - n)
        agent = AGENTS[n % len(AGENTS)]
        row = _approval(n, agent, rng) if n % 5 < 3 else _relay(n, rng)
        run_id = f"run_{row['id'].removeprefix('req_')}"
        requests.append(
            row
            | {
                "run_id": run_id,
                "agent": agent,
                "status": "open",
                "created_at": created,
                "expires_at": created + timedelta(days=3),
            }
        )
        runs.append(
            RUN_DEFAULTS
            | {
                "id": run_id,
                "agent": agent,
                "conversation_id": f"conv_{n:06d}",
                "status": "pending",
                "version": 2,
                "turns": 1,
                "started_by": "sam",
                "created_at": created - timedelta(seconds=20),
                "updated_at": created,
            }
        )
    return runs, requests


def seed(db: Database, count: int) -> None:
    """A migrated store holding `count` open requests, written in one transaction."""
    migrate(db)
    runs, requests = seed_rows(count)
    with db.write() as s:
        s.execute(insert(RunRow.__table__), runs)  # type: ignore[attr-defined]
        s.execute(insert(RequestRow.__table__), requests)  # type: ignore[attr-defined]
    if not db.is_sqlite:
        # What autovacuum does to a table soon after a load: the planner's statistics and
        # the visibility map (index-only scans). SQLite keeps no statistics unless told.
        with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE relayq_requests, relayq_runs"))

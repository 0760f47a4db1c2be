"""`relayq demo`: the README's main job, on this machine, with nothing but Python.

It starts a broker (the machine's Redis if one answers on 127.0.0.1:6379,
else the embedded one), a worker, the API and Flower; runs a batch of refund
jobs with the `demo` agent (`relayq.demo`: a local lookup tool and an approval
relay tool); answers every approval through the HTTP API as a back-office
user would (refunds up to 150 approved, larger ones declined); waits for the
batch; prints a summary. Then two refunds of the `demo_refunds` agent, whose
refund tools are wrapped in `requires_approval`: one that finance edits to
half its amount, one that takes a quorum of two finance approvers, both
decided through `POST /api/requests/{id}/decision`. A webhook receiver in this
process gets the worker's events all along, checks each signature, and the
demo prints what it got. Last, it stops every process it started; with
`--keep`, it first leaves two refunds waiting in the inbox and keeps the
worker, the API and Flower running, their addresses and an approver's token
printed, until Ctrl-C (`cli.demo_stack`).

The store is SQLite under `.relayq/demo` (PostgreSQL is for `compose.yaml`).
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from cli.demo_stack import Stack, build_stack, forget_keys, keep_running, stopped_by_signals
from cli.render import plural
from relayq.demo import QUORUM_ABOVE, order_record
from store.models import FINISHED
from tasks import Settings
from tasks.webhooks.sender import verify_signature
from workers.embedded import ensure_embedded_redis, stop_embedded_redis

__all__ = ["main"]

LIMIT = 150.0
"""Refunds up to this amount are approved; larger ones are declined."""

console = Console()


def main(jobs: int = 20, home: Path | None = None, *, keep: bool = False) -> None:
    """Run the demo; with `keep`, leave its processes running until Ctrl-C, then stop them."""
    home = (home or Path(".relayq") / "demo").resolve()
    shutil.rmtree(home, ignore_errors=True)  # each demo starts from an empty store
    home.mkdir(parents=True)
    receiver = WebhookReceiver(secrets.token_urlsafe(32), keep_in=home / "webhooks.jsonl").start()
    stack = build_stack(home, webhook_url=receiver.url, webhook_secret=receiver.secret)
    settings = Settings.from_env(stack.env)
    if settings.embedded_broker:
        ensure_embedded_redis(settings)
    try:
        with stopped_by_signals():
            _run(stack, jobs, receiver, keep=keep)
            if keep:
                _leave_open(stack)
                keep_running(stack, console)
    except KeyboardInterrupt:
        console.print("[dim]interrupted[/dim]")
    finally:
        console.print("[dim]stopping the worker, the API and Flower ...[/dim]")
        stack.stop()
        receiver.stop()
        if settings.embedded_broker:
            stop_embedded_redis(settings)
        else:
            forget_keys(settings)


def _run(stack: Stack, jobs: int, receiver: WebhookReceiver, *, keep: bool) -> None:
    console.rule("relayq demo")
    broker = stack.env.get("RELAYQ_BROKER_URL", "the embedded Redis")
    console.print(f"broker: {broker}; store: SQLite in {stack.home}")
    console.print(f"webhooks: every event to {receiver.url}, a receiver in this process")
    stack.start("worker", "worker", "--loglevel", "WARNING")
    stack.start("api", "api", "--port", stack.api.rsplit(":", 1)[1])
    stack.start("flower", "flower", "--port", stack.flower.rsplit(":", 1)[1])
    stack.wait_for_api()

    _batch(stack, jobs)
    runs = [_edited_refund(stack), _quorum_refund(stack)]
    _webhooks(receiver, runs)
    if keep:
        return
    console.print(
        f"\nWhile it ran, the inbox was at {stack.api}/ and Flower at {stack.flower}/ "
        f"(backoffice's token and Flower's password in {stack.home / 'token'}). "
        "`relayq demo --keep` keeps them running; or start them yourself with "
        "`relayq worker`, `relayq api` and `relayq flower`."
    )


def _batch(stack: Stack, jobs: int) -> None:
    """The batch of `demo` jobs, each approved or declined by backoffice through the API."""
    jobs_file, results_file = stack.home / "jobs.jsonl", stack.home / "results.jsonl"
    with jobs_file.open("w") as out:
        for n in range(jobs):
            out.write(json.dumps({"id": f"job-{n + 1:02d}", "prompt": f"refund order {1001 + n}"}))
            out.write("\n")
    console.print(f"{jobs} refund {plural(jobs, 'job')} in {jobs_file}; each needs one approval\n")
    batch = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli.main",
            "batch",
            "demo",
            str(jobs_file),
            "-o",
            str(results_file),
        ],
        env=stack.env,
    )
    try:
        answered = _answer_approvals(stack, jobs, batch)
        code = batch.wait(timeout=300)
    finally:
        if batch.poll() is None:
            batch.terminate()
    _summary(results_file, answered)
    if code != 0:
        raise SystemExit(f"relayq demo: the batch ended with exit code {code}")


def _answer_approvals(
    stack: Stack, jobs: int, batch: subprocess.Popen[bytes]
) -> list[dict[str, Any]]:
    """Wait for every job's approval request, print them, answer each through the API."""
    answered: list[dict[str, Any]] = []
    with stack.http("backoffice") as http:
        deadline = time.monotonic() + 120
        while True:
            # A page of them: the demo's few jobs fit on one (at most 500).
            query: dict[str, str | int] = {"status": "open", "agent": "demo", "limit": 500}
            listing = http.get("/api/requests", params=query)
            pending = listing.raise_for_status().json()["items"]
            if len(pending) >= jobs or batch.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        _print_pending(pending)
        for stored in pending:
            call = stored["request"]["data"]["calls"][0]
            amount = float(call["input"]["amount"])
            approve = amount <= LIMIT
            body: dict[str, Any] = (
                {"ok": True, "output": f"approved by backoffice (limit {LIMIT:.0f})"}
                if approve
                else {"ok": False, "reason": f"{amount:.2f} is over the {LIMIT:.0f} limit"}
            )
            request_id = stored["request"]["id"]
            http.post(f"/api/requests/{request_id}/answer", json=body).raise_for_status()
            answered.append(
                {"order": call["input"]["order"], "amount": amount, "approved": approve}
            )
    done = f"{len(answered)} {plural(len(answered), 'approval')}"
    console.print(f"answered {done} through POST /api/requests/{{id}}/answer\n")
    return answered


def _print_pending(pending: list[dict[str, Any]]) -> None:
    waiting = f"{len(pending)} {plural(len(pending), 'approval')} waiting"
    table = Table(title=f"{waiting} (GET /api/requests?status=open)")
    for column in ("request", "agent", "order", "amount", "reason"):
        table.add_column(column)
    for stored in pending:
        call = stored["request"]["data"]["calls"][0]
        args = call["input"]
        table.add_row(
            stored["request"]["id"],
            stored["agent"],
            str(args["order"]),
            f"{float(args['amount']):.2f}",
            str(args["reason"]),
        )
    console.print()
    console.print(table)
    console.print()  # the batch's live progress line redraws over this one


def _summary(results_file: Path, answered: list[dict[str, Any]]) -> None:
    results = [json.loads(line) for line in results_file.read_text().splitlines() if line]
    table = Table(title="results (in input order)")
    for column in ("job", "run", "status", "text"):
        table.add_column(column)
    for r in results:
        table.add_row(
            r["id"], r.get("run_id") or "", r["status"], r.get("text") or r.get("error") or ""
        )
    console.print(table)
    statuses = Counter(r["status"] for r in results)
    approved = sum(1 for a in answered if a["approved"])
    console.print(
        f"{len(results)} {plural(len(results), 'job')}: "
        + ", ".join(f"{n} {status}" for status, n in sorted(statuses.items()))
        + f"; {approved} {plural(approved, 'refund')} approved, {len(answered) - approved} declined"
    )


# -- approvals with a policy: an edited amount, a quorum of two ---------------------------------


def _edited_refund(stack: Stack) -> str:
    """A refund of at most QUORUM_ABOVE: ann of finance halves its amount, and it runs so."""
    order = _order(lambda amount: 50 <= amount <= QUORUM_ABOVE)
    console.rule(f"an approval with an edited amount: order {order}")
    run_id = _start_refund(stack, order)
    with stack.http("ann") as ann:
        stored = _open_request(ann, run_id)
        request_id, proposed = stored["request"]["id"], stored["request"]["data"]["arguments"]
        _print_request(stored)
        half = round(float(proposed["amount"]) / 2, 2)
        body = {"decision": "edit", "arguments": {**proposed, "amount": half}}
        decided = ann.post(f"/api/requests/{request_id}/decision", json=body)
        decided.raise_for_status()
        after = decided.json()
        console.print(
            f"ann (finance) edits the amount to {half:.2f}, a partial refund, and approves:\n"
            f'POST /api/requests/{{id}}/decision {{"decision": "edit", "arguments": '
            f'{{…, "amount": {half}}}}}\n-> the request is {after["status"]} ({after["outcome"]})'
        )
        _print_trail(ann, request_id)
        run = _settled_run(ann, run_id)
    _print_refund(run_id, run)
    return run_id


def _quorum_refund(stack: Stack) -> str:
    """A refund above QUORUM_ABOVE: it runs once two of finance, ann and ben, approved it."""
    order = _order(lambda amount: amount > QUORUM_ABOVE)
    console.rule(f"a quorum request: order {order}, two of finance approve")
    run_id = _start_refund(stack, order)
    with stack.http("ann") as ann, stack.http("ben") as ben:
        stored = _open_request(ann, run_id)
        request_id, quorum = stored["request"]["id"], stored["quorum"]
        _print_request(stored)
        after = stored
        for person, http in (("ann", ann), ("ben", ben)):
            if after["status"] != "open":
                break  # resolved by fewer votes: a real model may pick the one-approval tool
            voted = http.post(f"/api/requests/{request_id}/decision", json={"decision": "approve"})
            voted.raise_for_status()
            votes = http.get(f"/api/requests/{request_id}/decisions").raise_for_status().json()
            approvals = sum(1 for d in votes if d["outcome"] in ("approved", "edited"))
            after = voted.json()
            console.print(
                f"{person} (finance) approves: {approvals} of {quorum} "
                f"{plural(quorum, 'approval')}, the request "
                + ("is still open" if after["status"] == "open" else f"is {after['status']}")
                + (f" ({after['outcome']})" if after["outcome"] else "")
            )
        _print_trail(ann, request_id)
        run = _settled_run(ann, run_id)
    _print_refund(run_id, run)
    return run_id


def _order(fits: Callable[[float], bool], start: int = 2001) -> str:
    """The first order from `start` whose (made-up, stable) amount `fits`."""
    n = start
    while not fits(float(order_record(str(n))["amount"])):
        n += 1
    return str(n)


def _leave_open(stack: Stack) -> None:
    """For `--keep`: two refunds left for a person to decide in the inbox, one of them
    needing two of finance."""
    console.rule("left for you in the inbox")
    orders = [
        _order(lambda amount: 50 <= amount <= QUORUM_ABOVE, start=3001),
        _order(lambda amount: amount > QUORUM_ABOVE, start=3001),
    ]
    runs = [_start_refund(stack, order) for order in orders]
    with stack.http("ann") as ann:
        for run_id in runs:
            _open_request(ann, run_id)
    console.print(
        f"the refunds of orders {orders[0]} and {orders[1]} wait for a decision (the second "
        "needs two of finance: ann, then ben)"
    )


def _start_refund(stack: Stack, order: str) -> str:
    with stack.http("support") as http:
        body = {"agent": "demo_refunds", "prompt": f"refund order {order}"}
        run_id: str = http.post("/api/runs", json=body).raise_for_status().json()["id"]
    console.print(f"support starts {run_id}: POST /api/runs {json.dumps(body)}")
    return run_id


def _open_request(http: httpx.Client, run_id: str, timeout: float = 60.0) -> dict[str, Any]:
    """The open request `run_id` waits on, once it waits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        query = {"run_id": run_id, "status": "open"}
        items = http.get("/api/requests", params=query).raise_for_status().json()["items"]
        if items:
            found: dict[str, Any] = items[0]
            return found
        time.sleep(0.2)
    raise SystemExit(f"relayq demo: {run_id} asked for no approval within {timeout:.0f} s")


def _settled_run(http: httpx.Client, run_id: str, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run: dict[str, Any] = http.get(f"/api/runs/{run_id}").raise_for_status().json()
        if run["status"] in FINISHED:
            return run
        time.sleep(0.2)
    raise SystemExit(f"relayq demo: {run_id} did not finish within {timeout:.0f} s")


def _print_request(stored: dict[str, Any]) -> None:
    request = stored["request"]
    table = Table(title="the approval waiting (GET /api/requests?run_id=...&status=open)")
    for column in ("request", "tool", "order", "amount", "approvers", "quorum"):
        table.add_column(column)
    proposed = request["data"]["arguments"]
    table.add_row(
        request["id"],
        request["data"]["tool"],
        str(proposed["order"]),
        f"{float(proposed['amount']):.2f}",
        ", ".join(stored["approvers"]),
        str(stored["quorum"]),
    )
    console.print(table)


def _print_trail(http: httpx.Client, request_id: str) -> None:
    trail = http.get(f"/api/requests/{request_id}/decisions").raise_for_status().json()
    table = Table(title="GET /api/requests/{id}/decisions")
    for column in ("who", "groups", "via", "outcome", "diff"):
        table.add_column(column)
    for d in trail:
        diff = d["diff"] and ", ".join(f"{k}: {a} -> {b}" for k, (a, b) in d["diff"].items())
        table.add_row(d["actor"], ", ".join(d["groups"]), d["via"], d["outcome"], diff or "")
    console.print(table)


def _print_refund(run_id: str, run: dict[str, Any]) -> None:
    for call in run["toolCalls"]:
        if call["name"].startswith("refund"):
            said = (call["output"].splitlines() or [""])[-1]
            console.print(f"the {call['name']} tool ran on the worker: {said!r}")
    console.print(f"{run_id} is {run['status']}: {run['text'] or run['error']}\n")


# -- webhooks -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Delivery:
    """One event as the receiver got it, its signature verified."""

    id: str
    type: str
    created_at: str
    data: dict[str, Any]
    attempt: int
    """1 unless an earlier attempt failed."""


class WebhookReceiver:
    """The demo's webhook endpoint: an HTTP server on 127.0.0.1, in a thread of this process,
    that checks every delivery's signature with `tasks.webhooks.sender.verify_signature`."""

    def __init__(self, secret: str, *, keep_in: Path) -> None:
        self.secret = secret
        self.keep_in = keep_in
        """Each event, a JSON line, written as it is first received and before it is
        answered: a delivery the worker records as made is in it, whenever the demo stops."""
        self.url = ""
        self._got: dict[str, Delivery] = {}
        self.refused = 0
        """Requests whose signature did not hold."""
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> WebhookReceiver:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hooks"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def events(self) -> list[Delivery]:
        """Each event once (a delivery may come twice: the id says so), in order of arrival."""
        with self._lock:
            return list(self._got.values())

    def _keep(self, headers: Message, body: bytes) -> bool:
        verified = verify_signature(
            self.secret,
            headers.get("X-Relayq-Timestamp", ""),
            body,
            headers.get("X-Relayq-Signature", ""),
        )
        with self._lock:
            if not verified:  # not relayq's, or replayed: refused, and not kept
                self.refused += 1
                return False
            event = json.loads(body)
            attempt = int(headers.get("X-Relayq-Attempt") or 1)
            delivery = Delivery(
                event["id"], event["type"], event["createdAt"], event["data"], attempt
            )
            if delivery.id not in self._got:
                self._got[delivery.id] = delivery
                with self.keep_in.open("a") as out:
                    out.write(json.dumps(dataclasses.asdict(delivery)) + "\n")
        return True

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200 if receiver._keep(self.headers, body) else 401)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the demo prints what it got; a line per request would bury it

        return Handler


def _webhooks(receiver: WebhookReceiver, runs: list[str]) -> None:
    """Wait for the approval runs' events and print them (the receiver keeps every event in
    webhooks.jsonl)."""
    console.rule("webhook deliveries")
    wanted = {(r, t) for r in runs for t in ("request.opened", "request.decided", "run.finished")}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        got = {(e.data.get("runId"), e.type) for e in receiver.events()}
        if wanted <= got:
            break
        time.sleep(0.2)
    events = receiver.events()
    table = Table(title=f"the approval runs' events, as POSTed to {receiver.url}")
    table.add_column("at (UTC)")
    table.add_column("event", no_wrap=True)
    table.add_column("run", no_wrap=True, max_width=15)
    table.add_column("what")
    table.add_column("verified")
    ours = [e for e in events if e.data.get("runId") in runs]
    for e in sorted(ours, key=lambda e: (runs.index(e.data["runId"]), e.created_at)):
        at = datetime.fromisoformat(e.created_at).strftime("%H:%M:%S.%f")[:-3]
        table.add_row(at, e.type, e.data["runId"], _what(e), "yes")
    console.print(table)
    kinds = Counter(e.type for e in events)
    refused = receiver.refused
    bad = f"; {refused} {plural(refused, 'request')} refused for a bad signature" if refused else ""
    console.print(
        f"{len(events)} {plural(len(events), 'event')} received so far ("
        + ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
        + "), every signature verified with tasks.webhooks.sender.verify_signature"
        + bad
    )
    if not wanted <= {(e.data.get("runId"), e.type) for e in events}:
        console.print("[yellow]some events of the approval runs had not arrived after 30 s[/]")


def _what(event: Delivery) -> str:
    data = event.data
    if event.type == "request.opened":
        return f"{data.get('tool')} for {', '.join(data.get('approvers') or []) or 'anyone'}"
    if event.type == "request.decided":
        return f"{data.get('outcome')} by {data.get('decidedBy')}"
    return str(data.get("status") or "")

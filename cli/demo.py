"""`relayq demo`: the README's main job, on this machine, with nothing but Python.

It starts a broker (the machine's Redis if one answers on 127.0.0.1:6379,
else the embedded one), a worker, the API and Flower; runs a batch of refund
jobs with the `demo` agent (`relayq.demo`: a local lookup tool and an approval
relay tool); answers every approval through the HTTP API as a back-office
user would (refunds up to 150 approved, larger ones declined); waits for the
batch; prints a summary; and stops every process it started.

The store is SQLite under `.relayq/demo` (PostgreSQL is for `compose.yaml`).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis
from rich.console import Console
from rich.table import Table

from tasks import Settings
from workers.embedded import ensure_embedded_redis, stop_embedded_redis

__all__ = ["main"]

LIMIT = 150.0
"""Refunds up to this amount are approved; larger ones are declined."""

console = Console()


@dataclass
class Stack:
    """The processes the demo started, and how to reach them."""

    home: Path
    env: dict[str, str]
    api: str
    flower: str
    token: str
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, *args: str) -> None:
        log = (self.home / f"{name}.log").open("wb")
        self.processes[name] = subprocess.Popen(
            [sys.executable, "-m", "cli.main", *args],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def exited(self) -> str | None:
        """The name of a process that has ended, if one has."""
        return next((name for name, p in self.processes.items() if p.poll() is not None), None)

    def stop(self) -> None:
        for proc in self.processes.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.processes.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def main(jobs: int = 20, home: Path | None = None) -> None:
    home = (home or Path(".relayq") / "demo").resolve()
    shutil.rmtree(home, ignore_errors=True)  # each demo starts from an empty store
    home.mkdir(parents=True)
    stack = _stack(home)
    settings = Settings.from_env(stack.env)
    if settings.embedded_broker:
        ensure_embedded_redis(settings)
    try:
        _run(stack, jobs)
    finally:
        console.print("[dim]stopping the worker, the API and Flower ...[/dim]")
        stack.stop()
        if settings.embedded_broker:
            stop_embedded_redis(settings)
        else:
            _forget_keys(settings)


def _stack(home: Path) -> Stack:
    api_port, flower_port = _free_port(), _free_port()
    token = secrets.token_urlsafe(24)
    (home / "token").write_text(token)
    (home / "token").chmod(0o600)
    env = {
        **os.environ,
        "RELAYQ_HOME": str(home),
        "RELAYQ_AGENTS": "relayq.demo",
        "RELAYQ_API_TOKENS": f"backoffice:approver:{token}",
        "RELAYQ_FLOWER_AUTH": f"demo:{token}",
        "RELAYQ_DATABASE_URL": f"sqlite:///{home / 'relayq.db'}",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    if "RELAYQ_BROKER_URL" not in os.environ and _port_open(6379):
        env["RELAYQ_BROKER_URL"] = "redis://127.0.0.1:6379/0"
        env["RELAYQ_KEY_PREFIX"] = f"relayq-demo-{secrets.token_hex(4)}:"
    return Stack(
        home=home,
        env=env,
        api=f"http://127.0.0.1:{api_port}",
        flower=f"http://127.0.0.1:{flower_port}",
        token=token,
    )


def _run(stack: Stack, jobs: int) -> None:
    console.rule("relayq demo")
    broker = stack.env.get("RELAYQ_BROKER_URL", "the embedded Redis")
    console.print(f"broker: {broker}; store: SQLite in {stack.home}")
    stack.start("worker", "worker", "--loglevel", "WARNING")
    stack.start("api", "api", "--port", stack.api.rsplit(":", 1)[1])
    stack.start("flower", "flower", "--port", stack.flower.rsplit(":", 1)[1])
    _wait_for_api(stack)

    jobs_file, results_file = stack.home / "jobs.jsonl", stack.home / "results.jsonl"
    with jobs_file.open("w") as out:
        for n in range(jobs):
            out.write(json.dumps({"id": f"job-{n + 1:02d}", "prompt": f"refund order {1001 + n}"}))
            out.write("\n")
    console.print(f"{jobs} refund jobs in {jobs_file}; each needs one approval\n")
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
    console.print(
        f"\nWhile it ran, the inbox was at {stack.api}/ and Flower at {stack.flower}/ "
        f"(token and password in {stack.home / 'token'}). Start them yourself with "
        "`relayq worker`, `relayq api` and `relayq flower`."
    )


def _answer_approvals(
    stack: Stack, jobs: int, batch: subprocess.Popen[bytes]
) -> list[dict[str, Any]]:
    """Wait for every job's approval request, print them, answer each through the API."""
    headers = {"Authorization": f"Bearer {stack.token}"}
    answered: list[dict[str, Any]] = []
    with httpx.Client(base_url=stack.api, headers=headers, timeout=30) as http:
        deadline = time.monotonic() + 120
        while True:
            # A page of them: the demo's few jobs fit on one (at most 500).
            listing = http.get("/api/requests", params={"status": "open", "limit": 500})
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
    console.print(f"answered {len(answered)} approvals through POST /api/requests/{{id}}/answer\n")
    return answered


def _print_pending(pending: list[dict[str, Any]]) -> None:
    table = Table(title=f"{len(pending)} approvals waiting (GET /api/requests?status=open)")
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
        f"{len(results)} jobs: "
        + ", ".join(f"{n} {status}" for status, n in sorted(statuses.items()))
        + f"; {approved} refunds approved, {len(answered) - approved} declined"
    )


def _wait_for_api(stack: Stack, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        name = stack.exited()
        if name is not None:
            log = (stack.home / f"{name}.log").read_text()[-2000:]
            raise SystemExit(f"relayq demo: the {name} process exited early; {name}.log:\n{log}")
        try:
            if httpx.get(f"{stack.api}/openapi.json", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"relayq demo: the API did not answer at {stack.api} within {timeout:.0f} s")


def _forget_keys(settings: Settings) -> None:
    """Leave the machine's Redis as the demo found it: delete the keys under its prefix."""
    client = redis.Redis.from_url(settings.broker_url)
    try:
        for key in client.scan_iter(match=f"{settings.key_prefix}*", count=1000):
            client.delete(key)
    finally:
        client.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.3):
            return True
    except OSError:
        return False

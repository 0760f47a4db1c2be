"""The processes `relayq demo` runs: a worker, the API and Flower, on one broker and store.

`build_stack` picks the ports, the people's tokens and the environment;
`Stack.start` starts each process in a session of its own, logging to
`RELAYQ_HOME/<name>.log`; `Stack.stop` stops them all. With `relayq demo
--keep`, `keep_running` prints where the inbox, the API and Flower are and
how to log in, and waits for Ctrl-C.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import httpx
import redis
from rich.console import Console

from tasks import Settings

__all__ = ["PEOPLE", "Stack", "build_stack", "forget_keys", "keep_running", "stopped_by_signals"]

PEOPLE = {
    "backoffice": ("approver", ""),
    "ann": ("approver", "finance"),
    "ben": ("approver", "finance"),
    "support": ("submitter", ""),
}
"""Who holds a token, with what role and groups: backoffice answers the batch,
support starts the approval runs, ann and ben of finance decide them."""


@dataclass
class Stack:
    """The processes the demo started, and how to reach them."""

    home: Path
    env: dict[str, str]
    api: str
    flower: str
    tokens: dict[str, str]
    """Each person's API token, by name (see PEOPLE)."""
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def http(self, person: str) -> httpx.Client:
        """An API client holding `person`'s token."""
        headers = {"Authorization": f"Bearer {self.tokens[person]}"}
        return httpx.Client(base_url=self.api, headers=headers, timeout=30)

    def start(self, name: str, *args: str) -> None:
        with (self.home / f"{name}.log").open("wb") as log:
            self.processes[name] = subprocess.Popen(
                [sys.executable, "-m", "cli.main", *args],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C reaches the demo, which stops them in order
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
                proc.wait()

    def wait_for_api(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            name = self.exited()
            if name is not None:
                log = (self.home / f"{name}.log").read_text()[-2000:]
                raise SystemExit(
                    f"relayq demo: the {name} process exited early; {name}.log:\n{log}"
                )
            try:
                if httpx.get(f"{self.api}/openapi.json", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise SystemExit(
            f"relayq demo: the API did not answer at {self.api} within {timeout:.0f} s"
        )


def build_stack(home: Path, *, webhook_url: str, webhook_secret: str) -> Stack:
    """Ports, tokens and the environment of the demo's processes (none started yet)."""
    api_port, flower_port = _free_port(), _free_port()
    tokens = {name: secrets.token_urlsafe(24) for name in PEOPLE}
    token = tokens["backoffice"]
    (home / "token").write_text(token)
    (home / "token").chmod(0o600)
    hooks = [{"name": "demo", "url": webhook_url, "secret": webhook_secret}]
    env = {
        **os.environ,
        "RELAYQ_HOME": str(home),
        "RELAYQ_AGENTS": "relayq.demo",
        "RELAYQ_API_TOKENS": ",".join(
            f"{name}:{role}:{tokens[name]}" + (f":{groups}" if groups else "")
            for name, (role, groups) in PEOPLE.items()
        ),
        "RELAYQ_FLOWER_AUTH": f"demo:{token}",
        "RELAYQ_DATABASE_URL": f"sqlite:///{home / 'relayq.db'}",
        "RELAYQ_WEBHOOKS": json.dumps(hooks),
        "RELAYQ_PUBLIC_URL": f"http://127.0.0.1:{api_port}",
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
        tokens=tokens,
    )


def keep_running(stack: Stack, out: Console) -> None:
    """Say where the inbox, the API and Flower are and how to log in; return on Ctrl-C
    (or SIGTERM), or once one of the processes has ended."""
    ann, flower = stack.tokens["ann"], stack.tokens["backoffice"]
    out.rule("the worker, the API and Flower keep running")
    lines = [
        f"inbox:  {stack.api}/",
        f"        log in as ann (approver, finance) with the token {ann}",
        f"API:    {stack.api}/docs  (Authorization: Bearer {ann})",
        f"Flower: {stack.flower}/  (user demo, password {flower})",
        f"env:    RELAYQ_HOME={stack.home} "
        + " ".join(f"{k}={stack.env[k]}" for k in _SHARED if k in stack.env)
        + " (for `relayq pending`, `relayq runs` ...)",
        f"logs:   {stack.home}/{{worker,api,flower}}.log",
    ]
    for line in lines:
        out.print(line, soft_wrap=True, markup=False, highlight=False)
    out.print("Ctrl-C stops them all.", soft_wrap=True)
    try:
        while (name := stack.exited()) is None:
            time.sleep(0.3)
    except KeyboardInterrupt:
        out.print()
        return
    out.print(f"the {name} process ended; see {stack.home / f'{name}.log'}", markup=False)


_SHARED = ("RELAYQ_DATABASE_URL", "RELAYQ_BROKER_URL", "RELAYQ_KEY_PREFIX", "RELAYQ_AGENTS")


@contextmanager
def stopped_by_signals() -> Iterator[None]:
    """While open, SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt, so whatever stops the
    demo's processes runs: by default the last two end it there and then, and a shell
    that starts it in the background (`relayq demo --keep &`) ignores the first."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    stopping = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = {s: signal.signal(s, interrupt) for s in stopping}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def forget_keys(settings: Settings) -> None:
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

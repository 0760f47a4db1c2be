"""A relay tool served by a host on another machine: the agent's `shell` has no code on
the workers; a `relayq host` process, holding nothing but the API's address and a host
token, leases each call, runs it and posts its output, and the run goes on.

Run it with `python -m examples.relay_host`: it starts a worker, the API and the host
(each a process of its own, as on three machines), starts a run over HTTP, and prints
what the run answered. The agent and the host's tool are the two functions below.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from relayq import Agent, InProcessRequest, InProcessResponse, InProcessToolCall
from relayq.hosts import LeasedCall
from relayq.relay import relay_tool

SHELL = relay_tool(
    "shell",
    "Run a command on the user's machine and return what it printed",
    {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
)


def generate(req: InProcessRequest) -> InProcessResponse:
    """A stand-in model: asks the host to run one command, then reports its output."""
    printed = [str(m["content"]) for m in req.messages if m["role"] == "tool"]
    if printed:
        return InProcessResponse(content=f"the host said: {printed[0].strip()}")
    command = "echo hello from the host"
    return InProcessResponse(
        tool_calls=[InProcessToolCall(id="c1", name="shell", arguments={"cmd": command})]
    )


coder = Agent("coder", generate, tools=[SHELL])
"""Workers and the API load it: RELAYQ_AGENTS=examples.relay_host."""


def run_shell(arguments: dict[str, Any], call: LeasedCall) -> str:
    """The host's `shell`: `relayq host --tool shell=examples.relay_host:run_shell`.
    `call.key` (`runId:callId:attempt`) names this try, for a command that must act once."""
    done = subprocess.run(
        shlex.split(arguments["cmd"]), capture_output=True, text=True, timeout=60, check=False
    )
    return done.stdout + done.stderr


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="relayq-host-example-"))
    port = _free_port()
    ops, laptop = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    env = {
        **os.environ,
        "RELAYQ_HOME": str(home),
        "RELAYQ_DATABASE_URL": f"sqlite:///{home / 'relayq.db'}",
        "RELAYQ_AGENTS": "examples.relay_host",
        # ops starts runs; the host `laptop` may serve `shell` and nothing else
        "RELAYQ_API_TOKENS": f"ops:submitter:{ops},laptop:host:{laptop}:shell",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    api = f"http://127.0.0.1:{port}"
    # The host's machine knows the API's address and its token, not the store or broker.
    host_env = {**os.environ, "RELAYQ_API_URL": api, "RELAYQ_API_TOKEN": laptop}
    processes = [
        _start(home, "worker", env, "worker", "--loglevel", "WARNING"),
        _start(home, "api", env, "api", "--port", str(port)),
        _start(home, "host", host_env, "host", "--tool", "shell=examples.relay_host:run_shell"),
    ]
    try:
        with httpx.Client(
            base_url=api, headers={"Authorization": f"Bearer {ops}"}, trust_env=False
        ) as http:
            run_id = _start_run(http, processes)
            print(f"started {run_id}; the host runs its shell call")
            while (run := http.get(f"/api/runs/{run_id}").json())["status"] != "done":
                time.sleep(0.1)
            print(run["text"])
    finally:
        for proc in processes:
            proc.terminate()
        for proc in processes:
            proc.wait(timeout=30)
        shutil.rmtree(home, ignore_errors=True)


def _start_run(http: httpx.Client, processes: list[subprocess.Popen[bytes]]) -> str:
    """Start the run once the API answers (the processes take a few seconds to start)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            res = http.post("/api/runs", json={"agent": "coder", "prompt": "say hello"})
            res.raise_for_status()
            return str(res.json()["id"])
        except httpx.HTTPError:
            if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
                raise
            time.sleep(0.2)


def _start(home: Path, name: str, env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    with (home / f"{name}.log").open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "cli.main", *args], env=env, stdout=log, stderr=log
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    main()

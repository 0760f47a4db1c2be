"""Each system through each scenario, interleaved, against a local model server a scenario."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from bench.inflight import free_port
from bench.peers import drive_relayq
from bench.peers.sample import Sample

ROOT = Path(__file__).resolve().parents[2]

SYSTEMS = ("relayq", "pydantic-ai", "langgraph")

PEERS = {
    "pydantic-ai": ("bench.peers.drive_pydantic_ai", ("pydantic-ai-slim", "openai")),
    "langgraph": (
        "bench.peers.drive_langgraph",
        ("langgraph", "langgraph-checkpoint-sqlite", "langchain-openai", "aiosqlite"),
    ),
}
"""A peer's driver module, and the packages it needs installed (as pip names them)."""

INSTALL = "pip install -e '.[peers]'"

PEER_TIMEOUT = 3600.0
"""Seconds a peer's process may take before the benchmark gives up on it."""


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """Runs started at once, each taking `turns` model turns that answer after `latency` s."""

    kind: str
    """`in flight` (turns/s against the ideal) or `per turn` (what a turn costs)."""
    runs: int
    turns: int
    latency: float


@dataclass
class Results:
    scenarios: list[Scenario]
    systems: list[str]
    """The systems asked for, installed or not, in the order they ran."""
    samples: dict[tuple[Scenario, str], list[Sample]] = field(default_factory=dict)
    """Each scenario's samples a system, one a repetition."""
    missing: dict[str, str] = field(default_factory=dict)
    """A system that is not installed, to the package it lacks."""


def in_flight(*, runs: int, turns: int, latency: float) -> Scenario:
    return Scenario(kind="in flight", runs=runs, turns=turns, latency=latency)


def per_turn(*, lengths: list[int], total: int) -> list[Scenario]:
    """The same `total` turns at each length, the model answering at once."""
    return [
        Scenario(kind="per turn", runs=max(1, total // n), turns=n, latency=0.0) for n in lengths
    ]


def lacking(system: str) -> str | None:
    """The first package a peer needs that is not installed, or None (relayq needs none).

    Asked of the installed packages' metadata: importing a peer here would
    put its import time and warnings into relayq's process.
    """
    _, packages = PEERS.get(system, ("", ()))
    for package in packages:
        try:
            metadata.distribution(package)
        except metadata.PackageNotFoundError:
            return package
    return None


def run_all(scenarios: list[Scenario], *, systems: list[str], repeat: int, home: Path) -> Results:
    """Each scenario in turn; within one, its systems one after another, `repeat` times over."""
    results = Results(scenarios, systems)
    for system in systems:
        package = lacking(system)
        if package is not None:
            results.missing[system] = package
    present = [s for s in systems if s not in results.missing]
    for n, scenario in enumerate(scenarios):
        port = free_port()
        with model_server(port, scenario):
            for k in range(repeat):
                for system in present:
                    folder = home / f"{n}-{system}-{k}"
                    folder.mkdir(parents=True)
                    sample = measure(system, scenario, port, folder)
                    results.samples.setdefault((scenario, system), []).append(sample)
    return results


def measure(system: str, scenario: Scenario, port: int, home: Path) -> Sample:
    if system == "relayq":
        return asyncio.run(
            drive_relayq.measure(port=port, runs=scenario.runs, turns=scenario.turns, home=home)
        )
    module = PEERS[system][0]
    done = subprocess.run(
        [sys.executable, "-m", module, "--base-url", f"http://127.0.0.1:{port}/v1",
         "--runs", str(scenario.runs), "--turns", str(scenario.turns), "--home", str(home)],
        cwd=ROOT, env=os.environ | {"NO_PROXY": "127.0.0.1,localhost"},
        stdout=subprocess.PIPE, text=True, timeout=PEER_TIMEOUT,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{system} exited {done.returncode} (its error is above)")
    return Sample.from_line(done.stdout)


@contextmanager
def model_server(port: int, scenario: Scenario) -> Iterator[None]:
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.model_server", "--port", str(port),
         "--latency", str(scenario.latency), "--turns", str(scenario.turns)],
        cwd=ROOT,
    )  # fmt: skip
    try:
        wait_listening(port, server)
        yield
    finally:
        server.terminate()
        server.wait(timeout=10)


def wait_listening(port: int, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the model server did not start") from None
            time.sleep(0.1)

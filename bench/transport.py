"""CPU per model call through the provider transport: httpx as it was, aiohttp as it is.

    python -m bench.transport                 # 500 calls in flight at 1 s, then one at a time
    python -m bench.transport --in-flight 100 --rounds 2 --sequential 100 --repeat 1

A local model server (`bench.model_server`) answers every call: after
`--latency` seconds for the calls in flight, at once for the sequential ones.
In each case the two transports take turns, `--repeat` times, in alternating
order. Each measurement is a fresh event loop that first warms up (opens its
connections), then makes its calls while this process's CPU time (all its
threads) is counted. The table shows the median of each, and old / new.

- in flight: `--in-flight` callers at once, each making `--rounds` calls in a row;
- sequential: one caller making `--sequential` calls in a row.

The old transport lives on here only, to be measured against: httpx clients
of 8 connections each, taken in turn, as `ProviderModel` had them.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import socket
import ssl
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import certifi
import httpx

# The dialect's own encoder and decoder: both transports do the same work around the call.
from relayq.providers import ProviderConfig, ProviderModel, openai_wire

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-bench-0000000000000000"
MESSAGES = [{"role": "user", "content": "Take one step, then say you are done."}]


class Caller(Protocol):
    async def call(self) -> None: ...

    async def aclose(self) -> None: ...


class NewTransport:
    """`ProviderModel` as it is."""

    name = "aiohttp (new)"

    def __init__(self, config: ProviderConfig) -> None:
        self.model = ProviderModel(config, api_key=KEY, retries=0)

    async def call(self) -> None:
        await self.model.complete(MESSAGES)

    async def aclose(self) -> None:
        await self.model.aclose()


class OldTransport:
    """What `ProviderModel` did per call before aiohttp: encode, post through the next of
    its httpx clients (a pool scans all its connections per request, hence shards of 8),
    check the status, decode."""

    name = "httpx (old)"
    shard_size = 8

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config
        self.url = openai_wire.path(config.base_url)
        count = max(1, -(-config.max_connections // self.shard_size))
        per_shard = -(-config.max_connections // count)
        limits = httpx.Limits(max_connections=per_shard, max_keepalive_connections=per_shard)
        tls = ssl.create_default_context(cafile=certifi.where())
        self.shards = [
            httpx.AsyncClient(limits=limits, timeout=config.timeout, verify=tls)
            for _ in range(count)
        ]
        self.turn = 0

    async def call(self) -> None:
        body = openai_wire.encode(model=self.config.model, messages=MESSAGES, tools=[])
        headers = {**self.config.headers, **openai_wire.headers(self.config.resolve_key(KEY))}
        self.turn = (self.turn + 1) % len(self.shards)
        response = await self.shards[self.turn].post(
            self.url, json=body, headers=headers, timeout=self.config.timeout
        )
        if response.status_code >= 400:
            raise RuntimeError(f"the model server answered {response.status_code}")
        openai_wire.decode(response.json())

    async def aclose(self) -> None:
        for client in self.shards:
            await client.aclose()


TRANSPORTS: list[tuple[str, Callable[[ProviderConfig], Caller]]] = [
    (OldTransport.name, OldTransport),
    (NewTransport.name, NewTransport),
]


@dataclass
class Sample:
    calls: int
    cpu: float
    wall: float


@dataclass
class Case:
    name: str
    port: int
    callers: int
    rounds: int
    samples: dict[str, list[Sample]]

    def cpu_ms(self, transport: str) -> float:
        return statistics.median(1000 * s.cpu / s.calls for s in self.samples[transport])

    def per_second(self, transport: str) -> float:
        return statistics.median(s.calls / s.wall for s in self.samples[transport])


async def _measure(make: Callable[[], Caller], case: Case) -> Sample:
    caller = make()
    try:
        await asyncio.gather(*(caller.call() for _ in range(case.callers)))  # connections opened

        async def in_a_row() -> None:
            for _ in range(case.rounds):
                await caller.call()

        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(in_a_row() for _ in range(case.callers)))
        calls = case.callers * case.rounds
        return Sample(calls, time.process_time() - cpu, time.perf_counter() - wall)
    finally:
        await caller.aclose()


def run(case: Case, repeat: int) -> None:
    config = ProviderConfig(
        base_url=f"http://127.0.0.1:{case.port}/v1", model="bench", retries=0, timeout=60
    )
    for i in range(repeat):
        order = TRANSPORTS if i % 2 == 0 else TRANSPORTS[::-1]
        for name, transport in order:
            sample = asyncio.run(_measure(functools.partial(transport, config), case))
            case.samples.setdefault(name, []).append(sample)


def print_table(cases: list[Case], repeat: int) -> None:
    old, new = OldTransport.name, NewTransport.name
    print(f"\nCPU of this process per model call, median of {repeat}, {os.cpu_count()} cores\n")
    print(f"| case | calls | {old} CPU ms/call | {new} CPU ms/call | old / new "
          f"| {old} calls/s | {new} calls/s |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for c in cases:
        print(
            f"| {c.name} | {c.callers * c.rounds} | {c.cpu_ms(old):.3f} | {c.cpu_ms(new):.3f} "
            f"| {c.cpu_ms(old) / c.cpu_ms(new):.2f}x | {c.per_second(old):.0f} "
            f"| {c.per_second(new):.0f} |"
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(latency: float) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.model_server", "--port", str(port),
         "--latency", str(latency), "--turns", "1"],
        cwd=ROOT,
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return server, port
        except OSError:
            time.sleep(0.1)
    server.terminate()
    raise SystemExit("the model server did not start")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--in-flight", type=int, default=500, help="callers at once (0: skip the case)")
    add("--rounds", type=int, default=4, help="calls each of them makes in a row")
    add("--latency", type=float, default=1.0, help="seconds the server takes for those")
    add("--sequential", type=int, default=500, help="calls one at a time (0: skip the case)")
    add("--repeat", type=int, default=3, help="measurements of each transport in each case")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    # The local server must be reached directly, whatever proxy the environment names.
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = "127.0.0.1"
    servers = []
    try:
        cases = []
        if args.in_flight:
            server, port = start_server(args.latency)
            servers.append(server)
            name = f"{args.in_flight} in flight, {args.latency:g} s latency"
            cases.append(Case(name, port, args.in_flight, args.rounds, {}))
        if args.sequential:
            server, port = start_server(0.0)
            servers.append(server)
            cases.append(Case("one at a time, instant", port, 1, args.sequential, {}))
        for case in cases:
            run(case, args.repeat)
    finally:
        for server in servers:
            server.terminate()
            server.wait(10)
    print_table(cases, args.repeat)


if __name__ == "__main__":
    main()

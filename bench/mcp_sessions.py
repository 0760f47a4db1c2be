"""Sessions of MCP clients of earlier revisions held open by one `relayq mcp` process.

    python -m bench.mcp_sessions                    # 1,000 sessions of 2025-11-25 clients
    python -m bench.mcp_sessions --sessions 200

A client of 2025-06-18 or 2025-11-25 (the TypeScript SDK 1.x, desktop and IDE clients)
gets a session that lives in the process until it is closed or idle for 30 minutes
(issue 52). One `relayq mcp` process on a SQLite store, measured twice side by side:
with one session, then with `--sessions` more opened (`initialize`, then
`notifications/initialized`, 50 at a time) and left idle: the process's resident memory,
its CPU while nothing is asked of it (`--idle` seconds, a share of one core), what opening
one took (p50, p99), and a client's `tools/list` (p50, p99, and the p50's ratio to one
session).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench.homes import bench_home
from bench.inflight import free_port

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "tok-bench-mcp"
VERSION = "2025-11-25"
HEADERS = {"Accept": "application/json, text/event-stream", "Authorization": f"Bearer {TOKEN}"}


TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


async def _idle_cpu(pid: int, seconds: float) -> float:
    """The process's CPU while nothing is asked of it: a share of one core."""
    before = _cpu_s(pid)
    await asyncio.sleep(seconds)
    return (_cpu_s(pid) - before) / seconds


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _open(http: httpx.AsyncClient, url: str) -> tuple[str, float]:
    """A new session's id, and the seconds its opening took."""
    began = time.perf_counter()
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": VERSION, "capabilities": {"elicitation": {}},
        "clientInfo": {"name": "bench", "version": "1"}}}  # fmt: skip
    reply = await http.post(url, json=init, headers=HEADERS)
    reply.raise_for_status()
    session = reply.headers["mcp-session-id"]
    headers = {**HEADERS, "Mcp-Session-Id": session, "MCP-Protocol-Version": VERSION}
    done = await http.post(
        url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers
    )
    assert done.status_code == 202, done.text
    return session, time.perf_counter() - began


async def _listings(http: httpx.AsyncClient, url: str, session: str, n: int) -> list[float]:
    headers = {**HEADERS, "Mcp-Session-Id": session, "MCP-Protocol-Version": VERSION}
    took = []
    for i in range(n):
        began = time.perf_counter()
        reply = await http.post(
            url, json={"jsonrpc": "2.0", "id": i + 2, "method": "tools/list"}, headers=headers
        )
        reply.raise_for_status()
        took.append(time.perf_counter() - began)
    return took


def _ms(values: list[float], q: float) -> float:
    return 1000 * sorted(values)[min(len(values) - 1, int(q * len(values)))]


async def measure(
    url: str, pid: int, sessions: int, listings: int, idle: float
) -> list[dict[str, Any]]:
    limits = httpx.Limits(max_connections=60)
    async with httpx.AsyncClient(timeout=60, trust_env=False, limits=limits) as http:
        first, _ = await _open(http, url)
        await _listings(http, url, first, 20)  # warm
        rows = [{"sessions": 1, "rss": _rss_mb(pid), "idle": await _idle_cpu(pid, idle),
                 "open": [], "list": await _listings(http, url, first, listings)}]  # fmt: skip
        gate = asyncio.Semaphore(50)

        async def one() -> float:
            async with gate:
                return (await _open(http, url))[1]

        opened = await asyncio.gather(*(one() for _ in range(sessions)))
        rows.append({"sessions": 1 + sessions, "rss": _rss_mb(pid),
                     "idle": await _idle_cpu(pid, idle), "open": list(opened),
                     "list": await _listings(http, url, first, listings)})  # fmt: skip
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    base = statistics.median(rows[0]["list"])
    print(
        f"{'sessions':>9} {'RSS MB':>8} {'idle CPU':>9} {'open p50':>9} {'open p99':>9} "
        f"{'list p50':>9} {'list p99':>9} {'p50 ratio':>10}"
    )
    for row in rows:
        opens = row["open"]
        o50 = f"{_ms(opens, 0.5):.1f}" if opens else "-"
        o99 = f"{_ms(opens, 0.99):.1f}" if opens else "-"
        ratio = statistics.median(row["list"]) / base
        idle = f"{100 * row['idle']:.1f}%"
        print(
            f"{row['sessions']:>9,} {row['rss']:>8.1f} {idle:>9} {o50:>9} {o99:>9} "
            f"{_ms(row['list'], 0.5):>9.2f} {_ms(row['list'], 0.99):>9.2f} {ratio:>9.2f}x"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--listings", type=int, default=200)
    parser.add_argument("--idle", type=float, default=5.0, help="seconds idle measured")
    args = parser.parse_args(argv)
    if args.sessions < 1 or args.listings < 1 or args.idle <= 0:
        parser.error("--sessions and --listings must be at least 1, --idle more than 0")
    with bench_home("mcp-sessions") as home:
        port = free_port()
        env = {
            **os.environ,
            "RELAYQ_HOME": str(home),
            "RELAYQ_DATABASE_URL": f"sqlite:///{home / 'relayq.db'}",
            "RELAYQ_AGENTS": "bench.agents",
            "RELAYQ_API_TOKENS": f"bench:submitter:{TOKEN}",
            "RELAYQ_API_SECRET": "a-bench-secret-of-at-least-thirty-two-characters",
            "NO_PROXY": "127.0.0.1,localhost",
        }
        log = (home / "mcp.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "mcp", "--port", str(port)],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}/mcp"
            deadline = time.monotonic() + 60
            while b"Uvicorn running" not in (home / "mcp.log").read_bytes():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit((home / "mcp.log").read_text()[-2000:])
                time.sleep(0.05)
            rows = asyncio.run(measure(url, proc.pid, args.sessions, args.listings, args.idle))
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            log.close()
    print(f"relayq mcp, sessions of {VERSION} clients held open and idle ({args.listings} "
          "tools/list each side)")  # fmt: skip
    print_table(rows)


if __name__ == "__main__":
    main()

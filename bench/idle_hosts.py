"""Idle relay hosts on one API process: what their waiting costs the API, and its viewers.

    python -m bench.idle_hosts                      # 1,000 idle hosts, SQLite and PostgreSQL
    python -m bench.idle_hosts --against HEAD~6     # beside the code of another commit
    python -m bench.idle_hosts --pure               # beside uvicorn's pure-Python parts

For each store and each code (this checkout, and `--against`'s commit in a worktree of
its own), one `relayq api` process on a store of 2,000 queued runs, measured twice for
`--seconds` each: with no host, then with `--hosts` hosts (one process holding that many
long polls, `POST /api/relay/leases` for a tool no run calls, each waiting `--wait`
seconds and asked again as soon as it is answered): first alone, for the API process's
CPU (a share of one core, from /proc), then beside a viewer listing `GET
/api/runs?limit=50` one request after another, for its p50 and p99 and their ratio to
no hosts. The last columns say how long past its bound each wait ended (p50, worst).
`--pure` measures this checkout a second time with uvicorn's pure-Python HTTP parser
and event loop (h11 and asyncio, as without httptools and uvloop installed).

Targets (issue 50): 1,000 idle hosts cost under 5% of a core, leave the viewer's p50
within 1.2x of no hosts, and each wait ends within a second of its bound.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from bench.homes import bench_home
from bench.inflight import bench_env, bench_store, drop_postgres, free_port
from store import Database, RunSpec, create_runs

ROOT = Path(__file__).resolve().parents[1]
HOST_TOKEN = "tok-bench-idle-host"
VIEWER_TOKEN = "tok-bench-viewer"
TOKENS = f"idle:host:{HOST_TOKEN}:never_called,vic:viewer:{VIEWER_TOKEN}"
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Measured:
    store: str
    code: str
    hosts: int
    cpu: float
    """The API process's CPU seconds a second, with no viewer."""
    view_ms: list[float]
    late_s: list[float]
    """Each wait that ended: seconds past its bound."""
    answered: int = 0
    """Lease requests answered while the CPU was measured."""

    seconds: float = 0.0
    """How long the CPU was measured."""

    @property
    def ms_a_request(self) -> float | None:
        """The API's CPU milliseconds for each lease request answered, idle cost included."""
        return self.cpu * self.seconds * 1000 / self.answered if self.answered else None


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


async def view(url: str, seconds: float) -> list[float]:
    """The viewer: one listing after another for `seconds`; each one's milliseconds."""
    took = []
    headers = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
    timeout = httpx.Timeout(60)  # the old code kept a viewer waiting seconds at 1,000 hosts
    async with httpx.AsyncClient(
        base_url=url, headers=headers, timeout=timeout, trust_env=False
    ) as http:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            began = time.perf_counter()
            res = await http.get("/api/runs", params={"limit": 50})
            res.raise_for_status()
            took.append((time.perf_counter() - began) * 1000)
            await asyncio.sleep(0.02)
    return took


@dataclass(frozen=True)
class Code:
    """What the API runs: a checkout, and where to import from before it."""

    label: str
    where: Path
    path: tuple[Path, ...] = ()


PURE = """\
# bench.idle_hosts --pure: uvicorn finds neither, and takes h11 and asyncio.
import sys
sys.modules["httptools"] = None
sys.modules["uvloop"] = None
"""


def start_api(env: dict[str, str], code: Code, port: int, log: Path) -> subprocess.Popen[bytes]:
    path = os.pathsep.join(str(p) for p in (code.where, *code.path))
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "api", "--port", str(port)],
            cwd=code.where, env=env | {"PYTHONPATH": path, "PYTHONUNBUFFERED": "1"},
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + 60
    while b"Uvicorn running on" not in log.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            raise RuntimeError(f"the API did not start:\n{log.read_text()[-2000:]}")
        time.sleep(0.1)
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def start_hosts(url: str, hosts: int, wait: float, out: Path) -> subprocess.Popen[bytes]:
    """The hosts' process (`--hold`), once each of its long polls is sent."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.idle_hosts", "--hold", url, str(hosts), str(wait), str(out)],
        cwd=ROOT, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not out.with_suffix(".ready").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            raise RuntimeError("the hosts did not start")
        time.sleep(0.1)
    return proc


async def hold(url: str, hosts: int, wait: float, out: Path) -> None:
    """`hosts` long polls, each asked again once answered, until SIGTERM; then each
    wait's seconds past its bound, to `out`. Plain HTTP/1.1 on one connection a host:
    a client pool of a thousand connections (httpx's) spends more CPU than the API it
    measures, and its own delays would be counted as the API's."""
    ended: list[tuple[float, float]] = []  # when (epoch s), and how long past the bound
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    address = urlsplit(url)
    body = json.dumps({"tools": ["never_called"], "wait": wait}).encode()
    ask = (
        f"POST /api/relay/leases HTTP/1.1\r\nHost: {address.netloc}\r\n"
        f"Authorization: Bearer {HOST_TOKEN}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    sent = 0

    async def host() -> None:
        nonlocal sent
        reader, writer = await asyncio.open_connection(address.hostname, address.port)
        try:
            while not stopping.is_set():
                began = time.monotonic()
                sent += 1
                writer.write(ask)
                head = await reader.readuntil(b"\r\n\r\n")
                if not head.startswith(b"HTTP/1.1 200"):
                    raise RuntimeError(head.decode(errors="replace"))
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                ended.append((time.time(), time.monotonic() - began - wait))
        finally:
            writer.close()

    tasks = [asyncio.create_task(host()) for _ in range(hosts)]
    while sent < hosts:  # noqa: ASYNC110  (counted by the tasks, no event to wait on)
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)  # the last of them reach the API
    out.with_suffix(".ready").touch()
    await stopping.wait()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    out.write_text(json.dumps(ended))  # noqa: ASYNC240  (once, at the end)


async def measure(
    store: str, code: str, api_url: str, pid: int, hosts: int, args: argparse.Namespace, home: Path
) -> Measured:
    holder = None
    out = home / f"late-{code.replace(', ', '-')}-{hosts}.json"
    if hosts:
        holder = await asyncio.to_thread(start_hosts, api_url, hosts, args.wait, out)
    try:
        await asyncio.sleep(2.0)  # settled: the hosts' first requests taken in
        # The API's own cost first, with no viewer; then the viewer, beside the hosts.
        before, began, since = cpu_seconds(pid), time.monotonic(), time.time()
        await asyncio.sleep(args.seconds)
        cpu = (cpu_seconds(pid) - before) / (time.monotonic() - began)
        until = time.time()
        took = await view(api_url, args.seconds)
    finally:
        if holder is not None:
            await asyncio.to_thread(stop, holder)
    ended = json.loads(out.read_text()) if hosts and out.exists() else []
    answered = sum(since <= at <= until for at, _ in ended)
    late = [past for _, past in ended]
    return Measured(store, code, hosts, cpu, took, late, answered, args.seconds)


async def one_store(
    args: argparse.Namespace, store: str, home: Path, url: str, codes: list[Code]
) -> list[Measured]:
    env = bench_env(home, url, 9, f"relayq-bench-idle-{os.getpid()}-{store}:")
    env["RELAYQ_API_TOKENS"] = TOKENS
    found: list[Measured] = []
    for code in codes:
        port = free_port()
        log = home / f"api-{code.label.replace(' ', '-')}.log"
        api = await asyncio.to_thread(start_api, env, code, port, log)
        try:
            if not found:
                seed(url)
            for hosts in (0, args.hosts):
                found.append(
                    await measure(
                        store, code.label, f"http://127.0.0.1:{port}", api.pid, hosts, args, home
                    )
                )
        finally:
            await asyncio.to_thread(stop, api)
    return found


def seed(url: str) -> None:
    """2,000 queued runs for the viewer to list (no worker takes them)."""
    db = Database(url)
    try:
        spec = RunSpec("bench-relayed", started_by="bench")
        create_runs(db, spec, [(f"run_idle_{n:05d}", f"prompt {n}") for n in range(2000)])
    finally:
        db.dispose()


def pct(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def print_table(found: list[Measured], wait: float) -> None:
    print(f"\nidle hosts on one API process, each long poll waiting {wait:g} s\n")
    print("| store | code | hosts | API CPU (of a core) | CPU ms a request | viewer p50 ms | p99 | "
          "p50 / no hosts | waits ended | past the bound p50 s | worst |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    base: dict[tuple[str, str], float] = {}
    for m in found:
        p50 = pct(m.view_ms, 50)
        if m.hosts == 0:
            base[(m.store, m.code)] = p50
        ratio = p50 / base[(m.store, m.code)]
        late = f"{pct(m.late_s, 50):.2f} | {max(m.late_s):.2f}" if m.late_s else "- | -"
        each = "-" if m.ms_a_request is None else f"{m.ms_a_request:.2f}"
        print(
            f"| {m.store} | {m.code} | {m.hosts:,} | {m.cpu:.1%} | {each} | {p50:.2f} | "
            f"{pct(m.view_ms, 99):.2f} | {ratio:.2f}x | {len(m.late_s):,} | {late} |"
        )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--hosts", type=int, default=1000, help="idle hosts, each one long poll at a time")
    add("--wait", type=float, default=20.0, help="seconds each long poll waits")
    add("--seconds", type=float, default=30.0, help="seconds each phase is measured")
    add("--stores", default="sqlite,postgresql", help="stores to compare, comma-separated")
    add("--against", help="a commit to measure beside this checkout (a worktree of its own)")
    add("--pure", action="store_true", help="also with uvicorn's h11 and asyncio")
    add("--hold", nargs=4, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.hold:
        url, hosts, wait, out = args.hold
        asyncio.run(hold(url, int(hosts), float(wait), Path(out)))
        return
    found: list[Measured] = []
    with bench_home("rq-bench-idle-") as base:
        codes = [Code("this", ROOT)]
        if args.pure:
            (base / "pure").mkdir()
            (base / "pure" / "sitecustomize.py").write_text(PURE)
            codes.insert(0, Code("this, pure", ROOT, (base / "pure",)))
        if args.against:
            tree = base / "against"
            subprocess.run(
                ["git", "worktree", "add", "--detach", str(tree), args.against],
                cwd=ROOT, check=True, capture_output=True,
            )  # fmt: skip
            codes.insert(0, Code(args.against, tree))
        try:
            for store in args.stores.split(","):
                made = bench_store(base, store, "idle")
                if made is None:
                    continue
                home, url, name = made
                try:
                    found += asyncio.run(one_store(args, store, home, url, codes))
                finally:
                    if store != "sqlite":
                        drop_postgres(name)
        finally:
            if args.against:
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(base / "against")],
                    cwd=ROOT, check=False, capture_output=True,
                )  # fmt: skip
    print_table(found, args.wait)


if __name__ == "__main__":
    main()

"""How fast the approvals inbox answers with 100 open requests, and with 10,000.

    python -m bench.inbox                          # SQLite, 100 and 10,000 open requests
    python -m bench.inbox --sizes 100,10000,50000 --samples 50 --postgres --markdown

The issue asks that the inbox "stays server-rendered and fast with 10,000 open
requests". For each size a fresh store is seeded in bulk with open requests as
`store.requests.open_request` writes them: relay calls with their arguments,
and tool approvals with a policy naming approver groups, each waiting run
beside its request. The real server (`relayq api`, a process of its own) serves
that store, one server per size, all running at once. A client times each
page as an approver logged in to the inbox (its session cookie) or holding an
API token sees it, from sending the request to the first byte of the body
(time to first byte): median and 95th percentile over `--samples` requests
after a warm-up, the sizes taken in turn sample after sample, so that whatever
else the machine does weighs on each alike; and the body's size. The pages: the
inbox's first page, filtered by agent, by approver group and by text, and a
page from a cursor halfway through the open requests; beside them, the JSON
API's page of 50 and its page from the same cursor. The last column divides the
largest size's median by the smallest's: near 1, the page does not grow with
the inbox.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
from rich.console import Console
from rich.table import Table

from bench.inbox_seed import seed
from bench.inflight import drop_postgres, free_port, postgres_url
from store import Database

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-inbox-approver-token"
# An approver in two groups: the page shows every request's approve and decline forms.
TOKENS = f"alice:approver:{TOKEN}:finance|ops"
COOKIE = "relayq_token"
"""The inbox's session cookie (`api._inbox.COOKIE`): it holds the token itself."""

FILTERS = {"agent": "billing", "group": "finance", "q": "damaged"}
"""What the filtered pages ask for: each matches a fraction of the seeded requests."""


# --- the server and the client ------------------------------------------------------


@contextmanager
def serve(url: str, home: Path) -> Iterator[str]:
    """`relayq api` on a free port over the store at `url`; yields its base URL."""
    port = free_port()
    env = {
        **os.environ,
        "RELAYQ_HOME": str(home),
        "RELAYQ_DATABASE_URL": url,
        "RELAYQ_API_TOKENS": TOKENS,
        "RELAYQ_API_SECRET": "bench-inbox-secret-" + "x" * 32,
        "RELAYQ_AGENTS": "",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    log = home / "api.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "api", "--port", str(port)],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(base, server, log)
        yield base
    finally:
        server.terminate()
        server.wait(timeout=15)


def _wait_ready(base: str, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{base}/static/inbox.css", trust_env=False).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the API did not start:\n{log.read_text()[-2000:]}")
        time.sleep(0.05)


def client(base: str) -> httpx.Client:
    """One keep-alive connection, with the inbox's cookie and the API's bearer token."""
    return httpx.Client(
        base_url=base,
        cookies={COOKIE: TOKEN},
        trust_env=False,
        timeout=httpx.Timeout(60),
    )


@dataclass(frozen=True)
class Fetched:
    status: int
    ttfb: float
    """Seconds from sending the request to the first byte of the body."""
    size: int
    """Bytes of the body, as sent."""
    body: bytes = b""


def fetch(http: httpx.Client, path: str, *, bearer: bool, keep: bool = False) -> Fetched:
    """One GET, timed to its first body byte; the body is read to the end either way."""
    headers = {"Authorization": f"Bearer {TOKEN}"} if bearer else {}
    started = time.perf_counter()
    with http.stream("GET", path, headers=headers) as response:
        chunks = response.iter_raw()
        first = next(chunks, b"")
        ttfb = time.perf_counter() - started
        rest = b"".join(chunks)
    return Fetched(
        response.status_code, ttfb, len(first) + len(rest), first + rest if keep else b""
    )


# --- what is measured ---------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    label: str
    path: str
    bearer: bool = False
    """The JSON API (bearer token) rather than the inbox (its cookie)."""


@dataclass
class Measured:
    store: str
    size: int
    page: Page
    ttfbs: list[float]
    size_bytes: int
    ids: list[str] | None = field(default=None, repr=False)
    """The requests the page shows, in order (None: the page marks none)."""
    note: str = ""

    @property
    def median_ms(self) -> float:
        return 1000 * statistics.median(self.ttfbs)

    @property
    def p95_ms(self) -> float:
        ordered = sorted(self.ttfbs)  # nearest rank: an observed time, for any sample count
        return 1000 * ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


_ITEM = re.compile(rb'data-request-id="([^"]+)"')


def items_of(fetched: Fetched, page: Page) -> list[str] | None:
    """The ids of the requests a page shows, in order; None when the page marks none."""
    if page.bearer:
        return [item["request"]["id"] for item in json.loads(fetched.body)["items"]]
    found = [html.unescape(m.decode()) for m in _ITEM.findall(fetched.body)]
    return found or None


def middle_cursor(http: httpx.Client, count: int) -> str | None:
    """The API's cursor to the open requests' second half (None: fewer than two)."""
    half, cursor = count // 2, None
    step, seen = max(1, min(500, half)), 0
    while seen < half:
        params: dict[str, Any] = {"status": "open", "limit": step}
        if cursor is not None:
            params["cursor"] = cursor
        res = http.get("/api/requests", params=params, headers={"Authorization": f"Bearer {TOKEN}"})
        res.raise_for_status()
        page = res.json()
        seen, cursor = seen + len(page["items"]), page["nextCursor"]
        if cursor is None:
            return None
    return cursor


API_FIRST = "/api/requests?status=open&limit=50"


def pages(cursor: str | None) -> list[Page]:
    """The inbox's pages, then the API's; the cursor pages only where there is a cursor."""
    listed = [
        Page("inbox: first page", "/"),
        *(Page(f"inbox: {k}={v}", "/?" + urlencode({k: v})) for k, v in FILTERS.items()),
    ]
    if cursor is not None:
        listed.append(Page("inbox: cursor halfway", "/?" + urlencode({"cursor": cursor})))
    listed.append(Page("api: limit=50", API_FIRST, bearer=True))
    if cursor is not None:
        halfway = f"{API_FIRST}&{urlencode({'cursor': cursor})}"
        listed.append(Page("api: cursor halfway", halfway, bearer=True))
    return listed


Served = dict[int, tuple[httpx.Client, dict[str, Page]]]
"""Per size: a client of the server over a store of that many requests, and its pages."""


def serve_sizes(stack: ExitStack, store: str, sizes: Sequence[int], home: Path) -> Served | None:
    """A seeded store and its server for each size, all running at once until `stack`
    closes (None: no PostgreSQL server answers)."""
    served: Served = {}
    for size in sizes:
        where = home / f"{store}-{size}"
        where.mkdir(parents=True)
        url = stack.enter_context(store_at(store, where))
        if url is None:
            return None
        db = Database(url)
        started = time.perf_counter()
        try:
            seed(db, size)
        finally:
            db.dispose()
        seconds = time.perf_counter() - started
        print(f"{store}: seeded {size} open requests in {seconds:.1f} s", file=sys.stderr)
        http = stack.enter_context(client(stack.enter_context(serve(url, where))))
        served[size] = (http, {p.label: p for p in pages(middle_cursor(http, size))})
    return served


def measure(store: str, served: Served, *, samples: int, warmup: int) -> list[Measured]:
    """Each page at every size in turn, sample after sample, so that whatever else the
    machine does meanwhile weighs on every size alike. RuntimeError for a page not 200."""
    labels = dict.fromkeys(label for _, listed in served.values() for label in listed)
    results: list[Measured] = []
    for label in labels:
        at = {
            size: (http, listed[label])
            for size, (http, listed) in served.items()
            if label in listed
        }
        probes = {size: _probe(http, page) for size, (http, page) in at.items()}
        for _ in range(warmup):
            for http, page in at.values():
                fetch(http, page.path, bearer=page.bearer)
        times: dict[int, list[float]] = {size: [] for size in at}
        for _ in range(samples):
            for size, (http, page) in at.items():
                times[size].append(fetch(http, page.path, bearer=page.bearer).ttfb)
        for size, (_, page) in at.items():
            probe = probes[size]
            results.append(
                Measured(store, size, page, times[size], probe.size, items_of(probe, page))
            )
    _note_ignored(results)
    return results


def _probe(http: httpx.Client, page: Page) -> Fetched:
    probe = fetch(http, page.path, bearer=page.bearer, keep=True)
    if probe.status != 200:
        detail = probe.body[:300].decode(errors="replace")
        raise RuntimeError(f"{page.path} answered {probe.status}: {detail}")
    return probe


def _note_ignored(results: list[Measured]) -> None:
    """Flag a filter or cursor a page did not act on: it shows its first page's items."""
    first = {(r.size, r.page.bearer): r.ids for r in results if r.page.path in ("/", API_FIRST)}
    for r in results:
        same = r.ids and r.ids == first.get((r.size, r.page.bearer))
        if r.page.path not in ("/", API_FIRST) and same:
            r.note = "same items as the first page (ignored?)"


# --- the run and its table ----------------------------------------------------------


@contextmanager
def store_at(store: str, home: Path) -> Iterator[str | None]:
    """A fresh store's URL: a SQLite file in `home`, or a throwaway PostgreSQL database,
    dropped after (None: no PostgreSQL server answers)."""
    if store == "sqlite":
        yield f"sqlite:///{home / 'relayq.db'}"
        return
    name = f"relayq_bench_inbox_{os.getpid()}_{home.name}".replace("-", "_")
    url = postgres_url(name)
    if url is None:
        yield None
        return
    try:
        yield url
    finally:
        drop_postgres(name)


def run(
    sizes: Sequence[int], *, samples: int, warmup: int, postgres: bool, home: Path
) -> list[Measured]:
    """Every page at every size, on SQLite, and on PostgreSQL too if asked and reachable."""
    results: list[Measured] = []
    for store in ("sqlite", "postgresql") if postgres else ("sqlite",):
        with ExitStack() as stack:
            served = serve_sizes(stack, store, sizes, home)
            if served is None:
                print(f"skipping {store}: no server on 127.0.0.1:5432", file=sys.stderr)
                continue
            results += measure(store, served, samples=samples, warmup=warmup)
    return results


@dataclass(frozen=True)
class Row:
    """One page on one store, at every size: what the table prints."""

    store: str
    label: str
    cells: list[str]


_PER_SIZE = ("median ms", "p95 ms", "items", "KiB")


def _cells(r: Measured | None) -> list[str]:
    if r is None:
        return ["-"] * len(_PER_SIZE)
    shown = "-" if r.ids is None else str(len(r.ids))
    return [f"{r.median_ms:.1f}", f"{r.p95_ms:.1f}", shown, f"{r.size_bytes / 1024:.1f}"]


def rows(results: list[Measured], sizes: Sequence[int]) -> list[Row]:
    """Per size: median and p95 in ms, the items and KiB of the page; then the ratio of the
    largest size's median to the smallest's."""
    out = []
    keys = dict.fromkeys((r.store, r.page.label) for r in results)
    for store, label in keys:
        mine = {r.size: r for r in results if (r.store, r.page.label) == (store, label)}
        cells = [cell for size in sizes for cell in _cells(mine.get(size))]
        small, large = mine.get(sizes[0]), mine.get(sizes[-1])
        ratio = f"{large.median_ms / small.median_ms:.2f}x" if small and large else "-"
        notes = "; ".join(dict.fromkeys(r.note for r in mine.values() if r.note))
        out.append(Row(store, label, [*cells, ratio, notes]))
    return out


def headers(sizes: Sequence[int]) -> list[str]:
    per_size = [f"{h}\n@{size:,}" for size in sizes for h in _PER_SIZE]
    ratio = f"median\n{sizes[-1]:,} / {sizes[0]:,}"
    return ["store", "page", *per_size, ratio, "note"]


def print_table(results: list[Measured], sizes: Sequence[int], *, markdown: bool) -> None:
    names = headers(sizes)
    table_rows = [[r.store, r.label, *r.cells] for r in rows(results, sizes)]
    if markdown:
        print("| " + " | ".join(n.replace("\n", " ") for n in names) + " |")
        print("|---|---|" + "---:|" * (len(names) - 3) + "---|")
        for cells in table_rows:
            print("| " + " | ".join(cells) + " |")
        return
    table = Table(title="time to first byte, by open requests in the store")
    for n, name in enumerate(names):
        table.add_column(name, justify="left" if n < 2 or n == len(names) - 1 else "right")
    for cells in table_rows:
        table.add_row(*cells)
    console = Console()
    if not console.is_terminal:  # a file or a pipe: no line wrapped at 80 columns
        console = Console(width=160)
    console.print(table)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--sizes", default="100,10000", help="open requests in the store, comma-separated")
    add("--samples", type=int, default=30, help="timed requests per page")
    add("--warmup", type=int, default=5, help="untimed requests per page before them")
    add("--postgres", action="store_true", help="PostgreSQL too (a throwaway database)")
    add("--markdown", action="store_true", help="print the table as Markdown")
    args = parser.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",")]
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    with tempfile.TemporaryDirectory(prefix="rq-bench-inbox-") as home:
        results = run(
            args.sizes,
            samples=args.samples,
            warmup=args.warmup,
            postgres=args.postgres,
            home=Path(home),
        )
    print(
        f"\n{os.cpu_count()} cores; {args.samples} samples per page after {args.warmup} "
        "warm-up requests; time to first byte of the body, one keep-alive connection\n"
    )
    print_table(results, args.sizes, markdown=args.markdown)


if __name__ == "__main__":
    main()

"""An approval policy's cost per call at volume: 10,000 calls against 1,000 standing grants.

    python -m bench.grants                         # 10,000 calls, 1,000 grants
    python -m bench.grants --calls 2000 --stores sqlite

For each store, a fresh one holds `--grants` grants of the gated tool, as a back office
accumulates them: most cover one conversation each (exact arguments), some one run,
a few the whole agent with constraints (`amount <= 20`). Then `--calls` gated calls,
one after another, each from a conversation drawn at random, a third of them in one a
grant covers, go through the policy's grant step (`store.grants.use_grant`: the
lookup, the matchers, and for a covered call the counted use and its audit row, in
one transaction). Measured in one run: the step with no grants at all, then with the
grants, with their lookup index and without it in turn, round after round (the index
dropped and made again between them). The pure steps before it (deny constraints,
`when=`) are timed too, in process. The table gives, for each lever, the mean time of
a call no grant covers (a read, and nothing more) against the grant-free step, the
mean time of a call a grant approves (the read, then the counted use and its audit
row), and the p99 of all.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from sqlalchemy import text

from bench.inflight import bench_store, drop_postgres
from relayq.grants import GrantCaps
from relayq.matching import Matcher, parse_constraints
from relayq.policies import GrantAsk, arguments_digest, denial
from store import Database, migrate
from store.audit import Decider
from store.grants import NewGrant, grant_in, use_grant
from store.models import utcnow

ADMIN = Decider(name="bench", role="admin", via="python")
ROUNDS = 5
LOOKUP_INDEX = "CREATE INDEX ix_relayq_grants_lookup ON relayq_grants (tool, scope, scope_id)"
TOOL = "refund"
AGENT = "desk"
DENY = parse_constraints(["amount > 5000", 'currency not in ["EUR", "USD"]'])


@dataclass
class Lever:
    store: str
    name: str
    seconds: list[float]
    approved: int
    covered: list[float] = field(default_factory=list)
    """The times of the calls a grant approved (each a write), apart."""

    def mean_ms(self) -> float:
        return 1000 * statistics.fmean(self.seconds) if self.seconds else 0.0

    def covered_ms(self) -> float:
        return 1000 * statistics.fmean(self.covered) if self.covered else 0.0

    def p99_ms(self) -> float:
        ordered = sorted(self.seconds + self.covered)
        return 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]

    def calls(self) -> int:
        return len(self.seconds) + len(self.covered)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--grants", type=int, default=1_000)
    parser.add_argument("--stores", default="sqlite,postgresql")
    parser.add_argument("--seed", type=int, default=7)
    return parser.parse_args(argv)


def _seed(db: Database, count: int, rng: random.Random) -> list[str]:
    """`count` grants, as a back office makes them; the conversations they cover."""
    covered: list[str] = []
    with db.write() as s:
        for n in range(count):
            if n % 100 == 0:  # a few cover the whole agent, for small refunds
                scope, scope_id = "agent", None
                matcher = Matcher(where=parse_constraints([f"amount <= {rng.randint(5, 20)}"]))
            elif n % 10 == 0:
                scope, scope_id, matcher = "run", f"run_{n}", Matcher(arguments=_args(n))
            else:
                scope, scope_id = "conversation", f"conv_{n}"
                matcher = Matcher(arguments=_args(n))
                covered.append(scope_id)
            grant = NewGrant(
                tool=TOOL,
                agent=AGENT,
                scope=scope,  # type: ignore[arg-type]
                scope_id=scope_id,
                matcher=matcher,
                lasts=timedelta(days=30),
                max_uses=None,
                maker=ADMIN,
            )
            grant_in(s, grant, caps=None, quorum=1, now=utcnow())
    return covered


def _args(n: int) -> dict[str, object]:
    return {"order": f"{n:06d}", "amount": 40 + n % 50, "currency": "EUR"}


def _calls(count: int, covered: list[str], rng: random.Random, *, tag: str = "") -> list[GrantAsk]:
    """`count` calls, a third of them (where grants exist) in conversations one covers."""
    calls = []
    for k in range(count):
        if covered and k % 3 == 0:
            conversation = rng.choice(covered)
            n = int(conversation.split("_")[1])
        else:
            n = 100_000 + k
            conversation = f"conv_{n}"
        args = _args(n)
        calls.append(
            GrantAsk(
                run_id=f"run_{tag}c{k}",
                call_id="c1",
                call_key=f"run_{tag}c{k}:1:c1",
                agent=AGENT,
                tool=TOOL,
                arguments=args,
                arguments_hash=arguments_digest(args),
                conversation_id=conversation,
                started_by="sue",
                caps=GrantCaps(),
            )
        )
    return calls


def _timed(db: Database, lever: Lever, calls: list[GrantAsk]) -> None:
    for ask in calls:
        began = time.perf_counter()
        used = use_grant(db, ask) is not None
        took = time.perf_counter() - began
        if used:
            lever.approved += 1
            lever.covered.append(took)
        else:
            lever.seconds.append(took)


def _pure(store: str, calls: list[GrantAsk]) -> Lever:
    """The steps before the grants, in process: deny constraints and a `when=` predicate."""
    seconds = []
    for ask in calls:
        began = time.perf_counter()
        denial(DENY, ask.arguments)
        _ = float(ask.arguments["amount"]) > 10  # a when=
        seconds.append(time.perf_counter() - began)
    return Lever(store, "deny + when (in process)", seconds, 0)


def one(args: argparse.Namespace, base: Path, store: str) -> list[Lever] | None:
    """The levers on a fresh store: the grant step with no grants first, then with the
    grants, their lookup index and without it in turn, round after round, so that
    neither gets the warmer cache or the fuller file."""
    made = bench_store(base, store, f"grants_{store}")
    if made is None:
        return None
    _, url, name = made
    db = Database(url)
    try:
        migrate(db)
        rng = random.Random(args.seed)
        pure = _pure(store, _calls(args.calls, [], rng))
        bare = Lever(store, "no grants", [], 0)
        _timed(db, bare, _calls(args.calls, [], rng, tag="bare"))
        covered = _seed(db, args.grants, rng)
        indexed = Lever(store, f"{args.grants} grants, indexed", [], 0)
        unindexed = Lever(store, f"{args.grants} grants, no index", [], 0)
        per_round = max(1, args.calls // ROUNDS)
        for r in range(ROUNDS):
            _timed(db, indexed, _calls(per_round, covered, rng, tag=f"i{r}"))
            with db.write() as s:
                s.execute(text("DROP INDEX ix_relayq_grants_lookup"))
            _timed(db, unindexed, _calls(per_round, covered, rng, tag=f"u{r}"))
            with db.write() as s:
                s.execute(text(LOOKUP_INDEX))
        return [pure, bare, indexed, unindexed]
    finally:
        db.dispose()
        if store == "postgresql":
            drop_postgres(name)


def print_table(levers: list[Lever]) -> None:
    print(
        "| store | lever | calls | approved by a grant | mean ms, call no grant covers |"
        " x no grants | mean ms, call a grant approves | p99 ms, all calls |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    base = {lv.store: lv.mean_ms() for lv in levers if lv.name == "no grants"}
    for lv in levers:
        ratio = lv.mean_ms() / base[lv.store] if base.get(lv.store) else 0.0
        covered = f"{lv.covered_ms():.3f}" if lv.covered else "-"
        print(
            f"| {lv.store} | {lv.name} | {lv.calls()} | {lv.approved} | {lv.mean_ms():.3f} |"
            f" {ratio:.2f}x | {covered} | {lv.p99_ms():.3f} |"
        )


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    levers: list[Lever] = []
    with tempfile.TemporaryDirectory() as base:
        for store in args.stores.split(","):
            found = one(args, Path(base), store)
            if found is not None:
                levers.extend(found)
    if not levers:
        sys.exit("no store answered")
    print_table(levers)


if __name__ == "__main__":
    main()

"""The scale benchmark runs end to end at a tiny size, on servers of its own.

No timing is asserted: what is checked is that each per-turn count was read from the
servers (a turn commits, writes WAL, sends Redis commands), and that every worker count
and the calibration ran.
"""

from __future__ import annotations

import re

import pytest

from bench import scale
from tests.conftest import Parts
from tests.postgres_server import postgres_binaries

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.postgres,
    pytest.mark.usefixtures("leaves_no_folder"),
]
START_EARLY = True  # tests/conftest.py: its tests take long, so a lane takes them first


def number(out: str, row: str) -> float:
    found = re.search(rf"^\| {re.escape(row)} \| ([\d,.]+) \|$", out, re.M)
    assert found, f"no row {row!r} in:\n{out}"
    return float(found.group(1).replace(",", ""))


def test_the_benchmark_counts_what_a_turn_asks_of_each_server(
    capsys: pytest.CaptureFixture[str], machine_parts: Parts
):
    if postgres_binaries() is None:
        machine_parts.missing("postgres", "no initdb and pg_ctl to make a PostgreSQL of its own")
    scale.main(["--runs", "6", "--turns", "2", "--latency", "0.05", "--workers", "2",
                "--calibrate", "1", "--warm-up", "0"])  # fmt: skip

    out = capsys.readouterr().out
    transactions = number(out, "transactions (BEGIN)")
    statements = number(out, "statements (besides BEGIN, COMMIT and ROLLBACK)")
    trips = number(out, "round trips (every statement, BEGIN and COMMIT included)")
    assert 1 <= transactions < statements
    assert trips >= statements + 2 * transactions - 0.05
    assert number(out, "WAL bytes") > 0
    assert number(out, "Redis commands") >= 1
    assert "| `UPDATE relayq_runs` |" in out
    assert "| `lpush` |" in out
    assert re.search(r"^\| 2 \| 6 \| [\d.]+ \|", out, re.M)
    assert re.search(r"pgbench .* on this machine: tps = [\d.]+", out)

"""The outage benchmark runs end to end at a tiny size, with the circuit and without.

No timing is asserted: a test machine's figures say nothing. What is checked is
that the runs ride out the outage with the circuit, that without it the same
outage (longer than the shrunken retries) fails runs, and that the table compares them.
"""

from __future__ import annotations

import psycopg
import pytest

from bench import outage
from tests.conftest import Parts

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("leaves_no_folder")]
START_EARLY = True  # tests/conftest.py: its tests take long, so a lane takes them first


def test_the_benchmark_kills_the_provider_under_runs_with_and_without_the_circuit(capsys):
    outage.main(["--runs", "4", "--turns", "3", "--latency", "0.05", "--down", "2",
                 "--retries", "2", "--retry-base", "0.02", "--probe-every", "0.2"])  # fmt: skip

    out = capsys.readouterr().out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| o")]
    on, off = ([cell.strip("| ") for cell in row] for row in rows)
    assert (on[0], on[1], on[2], on[3], on[4]) == ("on", "4", "4", "0", "0"), "none failed"
    assert (off[0], off[1]) == ("off", "4")
    assert int(off[3]) > 0, "without the circuit the outage outlasts the retries"
    assert "circuit off, failed with: gave up after 3 tries" in out


@pytest.mark.postgres
def test_the_benchmark_silences_the_store_under_runs_with_the_default_bounds_and_tighter(
    capsys: pytest.CaptureFixture[str], machine_parts: Parts
):
    try:
        psycopg.connect(outage.parse([]).postgres, connect_timeout=2).close()
    except psycopg.OperationalError:
        machine_parts.missing("postgres", "no PostgreSQL to make the benchmark's database on")

    outage.main(["--hang", "store", "--runs", "4", "--turns", "3", "--latency", "0.05",
                 "--down", "2", "--workers", "1", "--give-up", "90"])  # fmt: skip

    out = capsys.readouterr().out
    rows = {
        cells[0]: cells
        for cells in (
            [cell.strip() for cell in line.strip("|").split("|")]
            for line in out.splitlines()
            if line.startswith(("| defaults", "| tighter"))
        )
    }
    assert set(rows) == {"defaults", "tighter"}
    for cells in rows.values():
        runs, done, failed = cells[1:4]
        assert (runs, done, failed) == ("14", "14", "0"), cells
        assert "never" not in cells, "every run moved again after the heal"
    assert "RELAYQ_STORE_SILENT_AFTER=6" in out

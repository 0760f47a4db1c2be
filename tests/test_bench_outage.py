"""The outage benchmark runs end to end at a tiny size, with the circuit and without.

No timing is asserted: a test machine's figures say nothing. What is checked is
that the runs ride out the outage with the circuit, that without it the same
outage (longer than the shrunken retries) fails runs, and that the table compares them.
"""

from __future__ import annotations

import pytest

from bench import outage

pytestmark = pytest.mark.timeout(300)
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

"""The latency benchmark runs end to end at a tiny size: both ways of waiting, both phases.

No timing is asserted: a test machine's figures say nothing. What is checked is
that each way ran its runs to the end and the table compares them.
"""

from __future__ import annotations

import pytest

from bench import latency

pytestmark = pytest.mark.usefixtures("leaves_no_folder")

START_EARLY = True  # tests/conftest.py: its tests take long, so a lane takes them first


def test_the_benchmark_measures_pushed_and_polled_waiting_side_by_side(capsys):
    latency.main(["--sequential", "4", "--many", "4"])

    out = capsys.readouterr().out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| sqlite")]
    assert [row[1] for row in rows] == ["pushed", "polled", "pushed", "polled"]
    assert [row[2] for row in rows[:2]] == ["4", "4"], "runs of each way, one at a time"
    assert [(row[2], row[3], row[-1]) for row in rows[2:]] == [("4", "20", "0 |")] * 2
    assert "sqlite: pushed / polled: sequential p50" in out

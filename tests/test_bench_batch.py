"""The batch benchmark runs end to end at a tiny size, in both layouts of workers.

No timing is asserted: a test machine's figures say nothing. What is checked is
that each layout ran both batches and the interactive runs to the end, and that
the tables compare them.
"""

from __future__ import annotations

import pytest

from bench import batch

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("leaves_no_folder")]
START_EARLY = True  # tests/conftest.py: its tests take long, so a lane takes them first


def test_the_benchmark_runs_a_batch_beside_interactive_runs_in_each_layout(capsys):
    batch.main(["--jobs", "30", "--small", "5", "--turns", "2", "--latency", "0.05",
                "--interactive", "2"])  # fmt: skip

    out = capsys.readouterr().out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| sqlite")]
    big = [row for row in rows if row[2] == "big"]
    assert [(row[1], row[3], row[4], row[-1]) for row in big] == [
        ("shared", "30", "60", "0 |"),
        ("split", "30", "60", "0 |"),
    ], "every job of each layout's batch done"
    interactive = [row for row in rows if len(row) == 9]
    assert [(row[1], row[2]) for row in interactive] == [("shared", "2"), ("split", "2")]
    assert out.count("0 outbox rows left") == 2

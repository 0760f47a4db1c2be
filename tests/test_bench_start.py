"""The big-start benchmark runs end to end at a small size, chunked and whole.

No timing is asserted: a test machine's figures say nothing. What is checked is
what a start must never cost the interactive runs beside it, whatever its
size: no claim lost, no tool call run again, no run failed.
"""

from __future__ import annotations

import pytest

from bench import start

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("leaves_no_folder")]
START_EARLY = True  # tests/conftest.py: its tests take long, so a lane takes them first


def test_a_batch_started_beside_interactive_runs_costs_them_no_claim_and_no_tool_call(capsys):
    start.main(["--jobs", "3000", "--chunk", "500", "--in-flight", "4", "--turns", "2",
                "--latency", "0.05", "--idle", "2"])  # fmt: skip

    out = capsys.readouterr().out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| sqlite")]
    assert [row[1] for row in rows] == ["chunked", "whole"]
    for row in rows:
        idle_runs, during_runs = int(row[5]), int(row[7])
        assert idle_runs > 0
        assert during_runs > 0
        claims_lost, repeated, failed = row[-3], row[-2], row[-1]
        assert (claims_lost, repeated, failed) == ("0", "0", "0 |"), row

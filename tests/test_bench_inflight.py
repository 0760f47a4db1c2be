"""The in-flight benchmark runs end to end at a tiny size, with idle batch queues beside.

No timing is asserted: what is checked is that the runs were measured with every run
done, and that the workers were consuming the batches' queues meanwhile (the benchmark
waits for their logs to say so, and fails if they never do).
"""

from __future__ import annotations

import re

import pytest

from bench import inflight

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("leaves_no_folder")]


def test_runs_are_measured_beside_idle_batch_queues_with_every_run_done(
    capsys: pytest.CaptureFixture[str],
):
    inflight.main(["--runs", "12", "--turns", "2", "--latency", "0.05", "--pools", "asyncio",
                   "--stores", "sqlite", "--batch-queues", "3"])  # fmt: skip

    out = capsys.readouterr().out
    row = r"^\| sqlite \| asyncio \| (\d+) \| 12 \| 12 \| 24 \|.* \| (\d+) \|$"
    rows = re.findall(row, out, re.M)
    assert rows == [("3", "0")], out

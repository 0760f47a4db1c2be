"""The soak benchmark runs end to end at a small size: one worker, waves of runs and
batches, and what the worker and the broker hold sampled after each.

No timing is asserted, nor memory (a short run has no plateau to speak of). What holds
at any size is checked: every run done, a sample a wave, and no key a finished batch
left on the broker (`workers.batch_queues` deletes its queue).
"""

from __future__ import annotations

import re

import pytest

from bench import soak

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("leaves_no_folder")]


def test_the_soak_samples_each_wave_and_no_batch_leaves_its_keys(capsys):
    soak.main(
        ["--waves", "4", "--wave", "20", "--turns", "2", "--latency", "0.01", "--settle", "2"]
    )

    out = capsys.readouterr().out
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines()
            if line.startswith("| ") and line[2].isdigit()]  # fmt: skip
    assert [r[0] for r in rows] == ["1", "2", "3", "4"]
    assert [r[1] for r in rows] == ["40", "80", "120", "160"]
    assert all(r[8] == "0" for r in rows), "every run done"
    # Waves 2 and 4 were batches: what they left on the broker is what wave 1 and 3 left
    keys = [int(r[7]) for r in rows]
    assert keys[1] == keys[3], keys
    assert re.search(r"^- keys: .*: flat$", out, re.M), out
    assert "- runs not done: 0" in out

"""The grants benchmark runs end to end at a tiny size, on SQLite and PostgreSQL.

No timing is asserted. What is checked is that each lever ran every call, that the
covered third of the calls was approved by a grant with the index and without it
alike, and that no call was approved where no grant exists.
"""

from __future__ import annotations

import pytest

from bench import grants

pytestmark = pytest.mark.timeout(300)


def test_the_benchmark_times_each_lever_and_grants_approve_the_covered_calls(
    capsys, machine_parts, tmp_path
):
    args = grants.parse(["--calls", "30", "--grants", "50"])
    found = [g for store in ("sqlite", "postgresql") if (g := grants.one(args, tmp_path, store))]
    if len(found) < 2:
        machine_parts.missing("postgres", "no PostgreSQL answered on 127.0.0.1:5432")

    for levers in found:
        by_name = {lv.name: lv for lv in levers}
        assert all(lv.calls() == 30 for lv in levers)
        assert by_name["no grants"].approved == 0
        assert by_name["50 grants, indexed"].approved == 10, "a third of the calls are covered"
        assert by_name["50 grants, no index"].approved == 10
    grants.print_table([lv for levers in found for lv in levers])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + 4 * 2  # the header, and 4 levers a store

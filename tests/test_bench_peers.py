"""The peers benchmark runs every system end to end at a tiny size, and prints its tables.

No timing is asserted: a test machine's figures say nothing. What is checked is
what the systems' results say (every run ended after the turns the model server
asked for), that each store grew, and that the tables have a row for each system
at each size. relayq runs on a real worker process with its own key prefix on
the machine's Redis (`bench_env`); the peers run in processes of their own.
"""

from __future__ import annotations

import pytest

from bench.inflight import redis_url
from bench.peers import run
from bench.peers.run import SYSTEMS, Results, in_flight, per_turn, run_all
from bench.peers.sample import Sample
from bench.peers.tables import print_tables, ratio

pytestmark = pytest.mark.timeout(300)
ONE_LANE = True  # tests/conftest.py: every system's runs, once for the module's tests
START_EARLY = True  # and its tests take long, so a lane takes them first

SCENARIOS = [in_flight(runs=3, turns=3, latency=0.05), *per_turn(lengths=[3], total=12)]


@pytest.fixture(scope="module")
def results(tmp_path_factory, machine_parts):
    if not redis_url():
        machine_parts.lacking(
            "redis",
            "no Redis answered on 127.0.0.1:6379",
            instead="the peers benchmark's relayq ran on the embedded broker",
        )
    # 3 runs of 3 turns in flight; 4 runs of 3 turns at once, every system once
    return run_all(SCENARIOS, systems=list(SYSTEMS), repeat=1, home=tmp_path_factory.mktemp("p"))


def test_every_peer_is_installed_so_the_benchmark_compares_them(results):
    assert results.missing == {}, f"install the peers: {run.INSTALL}"


def test_every_run_of_every_system_took_the_turns_the_server_asked_for(results):
    assert [s.runs for s in SCENARIOS] == [3, 4]
    for scenario in SCENARIOS:
        for system in SYSTEMS:
            if system in results.missing:
                continue
            [sample] = results.samples[scenario, system]
            assert sample.system == system
            assert sample.runs_done == scenario.runs
            assert sample.turns == scenario.runs * scenario.turns


def test_relayq_and_langgraph_store_their_turns_and_pydantic_ai_keeps_nothing(results):
    for scenario in SCENARIOS:
        [relayq] = results.samples[scenario, "relayq"]
        assert relayq.host_cpu_seconds is not None
        assert relayq.stored_bytes
        assert relayq.stored_bytes > 0
        if "langgraph" not in results.missing:
            [langgraph] = results.samples[scenario, "langgraph"]
            assert langgraph.stored_bytes
            assert langgraph.stored_bytes > 0
            assert langgraph.host_cpu_seconds is None
        if "pydantic-ai" not in results.missing:
            [pydantic_ai] = results.samples[scenario, "pydantic-ai"]
            assert pydantic_ai.stored_bytes is None


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_the_tables_have_a_row_for_each_system_at_each_size(results, capsys):
    # When the tables are printed
    print_tables(results, repeat=1)
    rows = [cells(line) for line in capsys.readouterr().out.splitlines() if line[:2] == "| "]
    installed = [s for s in SYSTEMS if s not in results.missing]

    # Then the in-flight table has each system's runs done, and a peer's ratio to relayq
    flight = {r[0]: r for r in rows if r[0] in SYSTEMS}
    assert sorted(flight) == sorted(installed)
    assert all(r[1] == "3/3" and r[2] == "9" for r in flight.values())
    assert flight["relayq"][-1] == "—"
    assert all(r[-1].endswith("x") for s, r in flight.items() if s != "relayq")

    # And the per-turn table has a row a system at each length, relayq's CPU split in two
    turns = {(r[0], r[1]): r for r in rows if r[0].isdigit()}
    assert sorted(turns) == sorted(("3", s) for s in installed)
    assert turns["3", "relayq"][2] == "4/4"
    assert "—" not in turns["3", "relayq"][3:5]
    if "pydantic-ai" in installed:
        assert turns["3", "pydantic-ai"][3:5] == ["—", "—"]
        assert turns["3", "pydantic-ai"][9] == "none"


def test_a_peer_not_installed_gets_a_row_saying_how_to_install_it(
    results, monkeypatch, capsys, tmp_path
):
    # Given LangGraph's driver needs a module that is not there
    monkeypatch.setitem(run.PEERS, "langgraph", ("bench.peers.drive_langgraph", ("no_such_mod",)))
    lacking = run_all([], systems=["relayq", "langgraph"], repeat=1, home=tmp_path)
    assert lacking.missing == {"langgraph": "no_such_mod"}

    # When the tables are printed with relayq's samples alone
    relayq_only = Results(
        SCENARIOS,
        ["relayq", "langgraph"],
        {k: v for k, v in results.samples.items() if k[1] == "relayq"},
        lacking.missing,
    )
    print_tables(relayq_only, repeat=1)
    out = capsys.readouterr().out

    # Then langgraph's rows say how to install it, and relayq's still print
    assert (
        out.count("| langgraph | not installed (no no_such_mod): `pip install -e '.[peers]'`") == 2
    )
    assert out.count("| relayq | 3/3 |") == 1
    assert "| 3 | relayq | 4/4 |" in out


def test_a_peers_sample_reads_back_from_its_output():
    sample = Sample(
        system="langgraph",
        runs=2,
        turns_each=3,
        runs_done=2,
        turns=6,
        seconds=0.5,
        cpu_seconds=0.1,
        bytes_written=4096,
        stored_bytes=8192,
    )
    assert Sample.from_line(f"a log line\n{sample.line()}\n") == sample
    with pytest.raises(ValueError, match="no sample"):
        Sample.from_line("a log line\n")


def test_a_ratio_keeps_two_significant_figures_when_small():
    assert ratio(184.0, 94.6) == "1.95x"
    assert ratio(1_028, 661_238) == "0.0016x"
    assert ratio(1.0, 0.0) == "n/a"
    assert ratio(None, 2.0) == "n/a"

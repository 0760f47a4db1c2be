"""The benchmark's markdown tables: each system's medians, and relayq's figure over each peer's."""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from bench.peers.run import INSTALL, Results, Scenario
from bench.peers.sample import Sample

NONE = "—"


@dataclass(frozen=True, kw_only=True)
class Figures:
    """A system's figures in one scenario: the median over its repetitions."""

    runs: int
    runs_done: int
    """The fewest runs done in any repetition."""
    turns: int
    """The fewest turns counted in any repetition."""
    seconds: float
    turns_per_second: float
    cpu_ms: float
    """CPU a turn, every process of the system's: relayq's worker and host together."""
    worker_cpu_ms: float | None
    host_cpu_ms: float | None
    """relayq's two processes apart; None for a peer, whose one process is both."""
    written_kb: float
    stored_bytes: float | None
    """Store growth a turn; None for a system that keeps no store."""


def figures(samples: list[Sample]) -> Figures:
    def median(of: Callable[[Sample], float]) -> float:
        return statistics.median(of(s) for s in samples)

    def per_turn(s: Sample, amount: float) -> float:
        return amount / max(s.turns, 1)

    split = samples[0].host_cpu_seconds is not None
    worker = median(lambda s: per_turn(s, 1000 * s.cpu_seconds))
    host = median(lambda s: per_turn(s, 1000 * (s.host_cpu_seconds or 0)))
    stored = median(lambda s: per_turn(s, s.stored_bytes or 0))
    return Figures(
        runs=samples[0].runs,
        runs_done=min(s.runs_done for s in samples),
        turns=min(s.turns for s in samples),
        seconds=median(lambda s: s.seconds),
        turns_per_second=median(lambda s: s.turns / s.seconds),
        cpu_ms=median(lambda s: per_turn(s, 1000 * (s.cpu_seconds + (s.host_cpu_seconds or 0)))),
        worker_cpu_ms=worker if split else None,
        host_cpu_ms=host if split else None,
        written_kb=median(lambda s: per_turn(s, s.bytes_written / 1000)),
        stored_bytes=stored if samples[0].stored_bytes is not None else None,
    )


def ratio(relayq: float | None, other: float | None) -> str:
    """relayq's figure over another's; two significant figures below 0.1, not `0.00x`."""
    if relayq is None or other is None or other == 0:
        return "n/a"
    r = relayq / other
    return f"{r:.2f}x" if r >= 0.1 else f"{r:.2g}x"


def number(value: float | None, digits: int) -> str:
    return "none" if value is None else f"{value:,.{digits}f}"


def print_tables(results: Results, *, repeat: int) -> None:
    print(
        f"\n{os.cpu_count()} cores, one local model server; systems interleaved, "
        f"median of {repeat}; relayq / this: relayq's figure over the system's, same run"
    )
    scenarios = results.scenarios
    for scenario in (s for s in scenarios if s.kind == "in flight"):
        print_in_flight(results, scenario)
    lengths = [s for s in scenarios if s.kind == "per turn"]
    if lengths:
        print_per_turn(results, lengths)


def not_installed(results: Results, system: str) -> str:
    return f"not installed (no {results.missing[system]}): `{INSTALL}`"


def print_in_flight(results: Results, scenario: Scenario) -> None:
    ideal = scenario.runs / scenario.latency if scenario.latency else float("inf")
    print(
        f"\n### In flight: {scenario.runs} runs of {scenario.turns} turns started at once, "
        f"model latency {scenario.latency:g} s (ideal: {ideal:,.0f} turns/s)\n"
    )
    print(
        "| system | runs done | turns | seconds | turns/s | % of ideal | relayq / this, turns/s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    mine = results.samples.get((scenario, "relayq"))
    base = figures(mine).turns_per_second if mine else None
    for system in results.systems:
        if system in results.missing:
            print(f"| {system} | {not_installed(results, system)} |||||")
            continue
        f = figures(results.samples[scenario, system])
        print(
            f"| {system} | {f.runs_done}/{f.runs} | {f.turns:,} | {f.seconds:.1f} "
            f"| {f.turns_per_second:,.1f} | {100 * f.turns_per_second / ideal:.0f}% "
            f"| {NONE if system == 'relayq' else ratio(base, f.turns_per_second)} |"
        )


def print_per_turn(results: Results, lengths: list[Scenario]) -> None:
    total = max(s.runs * s.turns for s in lengths)
    print(
        f"\n### Per turn as conversations grow: about {total:,} turns at each length, "
        "model answering at once\n"
    )
    print(
        "| turns a run | system | runs done | worker CPU ms/turn | host CPU ms/turn "
        "| CPU ms/turn | relayq / this | kB written/turn | relayq / this | stored B/turn "
        "| relayq / this |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for scenario in lengths:
        for system in results.systems:
            print(per_turn_row(results, scenario, system))
    print_notes(results.systems)


def per_turn_row(results: Results, scenario: Scenario, system: str) -> str:
    if system in results.missing:
        return f"| {scenario.turns} | {system} | {not_installed(results, system)} ||||||||"
    f = figures(results.samples[scenario, system])
    mine = results.samples.get((scenario, "relayq"))
    base = figures(mine) if mine and system != "relayq" else None

    def vs(of: Callable[[Figures], float | None]) -> str:
        return NONE if base is None else ratio(of(base), of(f))

    worker, host = cpu_split(f)
    return (
        f"| {scenario.turns} | {system} | {f.runs_done}/{f.runs} | {worker} | {host} "
        f"| {f.cpu_ms:.2f} | {vs(lambda x: x.cpu_ms)} "
        f"| {f.written_kb:,.1f} | {vs(lambda x: x.written_kb)} "
        f"| {number(f.stored_bytes, 0)} | {vs(lambda x: x.stored_bytes)} |"
    )


def cpu_split(f: Figures) -> tuple[str, str]:
    """relayq's worker and host CPU a turn; a peer has the one process."""
    if f.worker_cpu_ms is None or f.host_cpu_ms is None:
        return NONE, NONE
    return f"{f.worker_cpu_ms:.2f}", f"{f.host_cpu_ms:.2f}"


def print_notes(systems: list[str]) -> None:
    print(
        "\n- relayq: worker = its asyncio worker process; host = the DurableClient's process "
        "(starts the runs, polls the store until they end); CPU ms/turn = both. A peer runs "
        "host and agent in one process: its CPU is that process's."
    )
    if "pydantic-ai" in systems:
        print(
            "- pydantic-ai keeps no store: a run lives in its process's memory and is lost "
            "with it (no durability), so it stores nothing; written is what /proc counted."
        )
    print(
        "- stored: the growth of the SQLite database's pages in use, write-ahead log "
        "included, free pages not (relayq: its store; langgraph: its checkpointer's)."
    )

"""relayq beside Pydantic AI and LangGraph: same local model server, same scenario, interleaved.

    python -m bench.peers                              # 500 runs x 5 turns at 1 s; 25/200/800 turns
    python -m bench.peers --systems relayq,pydantic-ai --repeat 3
    python -m bench.peers --scenarios per-turn --lengths 25,800 --total 1600

Each system runs the way its users run it: relayq on a real asyncio worker with
a DurableClient host (Redis broker, SQLite store); Pydantic AI as an `Agent` in
plain asyncio, with nothing kept; LangGraph as a ReAct graph with an async SQLite
checkpointer, a thread a run. Each peer runs in a process of its own, so its CPU
and bytes written (from /proc) are its own.

In flight: N runs of 5 turns at once against a model answering after a fixed
latency: turns/s, and the share of the ideal (N / latency). Per turn: runs of 25,
200 and 800 turns (the same total turns at each length) against a model answering
at once: CPU, bytes written and store growth a turn. With `--repeat K` the systems
take turns K times over (relayq, pydantic-ai, langgraph, relayq, ...) and the
tables give the median. A peer that is not installed gets a row saying so
(`pip install -e '.[peers]'`); the others still run.
"""

from __future__ import annotations

import argparse

from bench.homes import bench_home
from bench.peers.run import SYSTEMS, Scenario, in_flight, per_turn, run_all
from bench.peers.tables import print_tables

SCENARIOS = ("in-flight", "per-turn")


def names(text: str, known: tuple[str, ...]) -> list[str]:
    chosen = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in known]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"{', '.join(unknown) or text!r}: pick from {', '.join(known)}"
        )
    return chosen


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add(
        "--systems",
        type=lambda t: names(t, SYSTEMS),
        default=list(SYSTEMS),
        help="comma-separated: relayq,pydantic-ai,langgraph",
    )
    add(
        "--scenarios",
        type=lambda t: names(t, SCENARIOS),
        default=list(SCENARIOS),
        help="comma-separated: in-flight,per-turn",
    )
    add("--repeat", type=int, default=1, help="times each system runs each scenario, interleaved")
    add("--runs", type=int, default=500, help="in flight: runs started at once")
    add("--turns", type=int, default=5, help="in flight: model turns a run")
    add("--latency", type=float, default=1.0, help="in flight: seconds the model takes a call")
    add("--lengths", default="25,200,800", help="per turn: turns a run, comma-separated")
    add("--total", type=int, default=3200, help="per turn: turns at each length")
    return parser.parse_args()


def scenarios(args: argparse.Namespace) -> list[Scenario]:
    chosen = []
    if "in-flight" in args.scenarios:
        chosen.append(in_flight(runs=args.runs, turns=args.turns, latency=args.latency))
    if "per-turn" in args.scenarios:
        lengths = [int(n) for n in args.lengths.split(",")]
        chosen += per_turn(lengths=lengths, total=args.total)
    return chosen


def main() -> None:
    args = parse()
    # LangGraph's checkpoints of long runs take gigabytes: removed as soon as they are read.
    with bench_home("rq-bench-peers-") as home:
        results = run_all(scenarios(args), systems=args.systems, repeat=args.repeat, home=home)
    print_tables(results, repeat=args.repeat)


if __name__ == "__main__":
    main()

"""`python -m workers [worker|beat] [celery options]`: start a process with sane defaults.

python -m workers                 # a worker on every relayq queue
python -m workers beat            # the sweeper's schedule
python -m workers worker -c 8     # any celery worker option
python -m workers worker -Q relayq.turns.support,relayq.answers   # chosen queues only

A worker consumes relayq's three queues unless `-Q` names others: an agent
with a queue of its own (`Agent(queue="relayq.turns.support")`) runs only on
workers started with `-Q` naming it. The queues of those queues' active batches
come with them (`RELAYQ_WORKER_BATCHES=serve`), or not (`skip`), or instead
(`only`): see `workers.batch_queues`.
"""

from __future__ import annotations

import asyncio
import sys

from relayq import ToolkitError
from relayq.agents import load_agents, registered_agents
from relayq.mcp import MCPError, check_servers
from workers.app import app, exit_code, settings
from workers.config import QUEUES
from workers.embedded import ensure_embedded_redis


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv) or ["worker"]
    if settings.embedded_broker:
        ensure_embedded_redis(settings)
    if args[0] == "worker":
        _check_mcp_servers()
        defaults = {("--loglevel", "-l"): "INFO", ("--queues", "-Q"): ",".join(QUEUES)}
        extra = [
            part
            for names, value in defaults.items()
            if not _given(args, names)
            for part in (names[0], value)
        ]
        args = ["worker", *extra, *args[1:]]
    # Celery returns the worker's exit status rather than exiting with it.
    sys.exit(exit_code(_celery(args)))


def _celery(args: list[str]) -> int | None:
    """`celery ARGS` on relayq's app. `worker` and `beat` go straight to Celery's own
    commands: its command group imports every installed plugin's command first, Flower's
    among them (tornado and all: half a second of every worker's start)."""
    if args[0] not in ("worker", "beat"):
        return app.start(argv=args)
    if args[0] == "worker":
        from celery.bin.worker import worker as command
    else:
        from celery.bin.beat import beat as command
    from celery.bin.base import CLIContext

    context = CLIContext(app=app, no_color=None, workdir=None, quiet=False)
    code: int | None = command.main(
        args=args[1:], prog_name=f"celery {args[0]}", obj=context, standalone_mode=False
    )
    return code


def _check_mcp_servers() -> None:
    """List the tools of every agent's MCP servers, or stop with one line naming the one that
    cannot be reached: each turn's calls to it would fail. A prefork worker's pool children
    inherit the listing, and connect again themselves."""
    if settings.agents:
        load_agents(settings.agents)
    for agent in registered_agents().values():
        if not agent.mcp_servers:
            continue
        try:
            asyncio.run(check_servers(list(agent.mcp_servers)))
        except (MCPError, ToolkitError) as exc:
            print(f"relayq: error: agent {agent.name!r}: {exc}", file=sys.stderr)
            sys.exit(1)


def _given(args: list[str], names: tuple[str, ...]) -> bool:
    return any(a == n or a.startswith(n + "=") for a in args for n in names)


if __name__ == "__main__":
    main()

"""Long-running processes: the Celery worker and beat, the HTTP API, Flower, the demo.

Each imports what it starts only when it runs: `workers.app` reads the
environment when imported, so options that set RELAYQ_* must come first.
"""

from __future__ import annotations

import importlib
import os
from enum import StrEnum
from typing import Annotated, Any

import typer

from cli._common import check_database, fail, load_agent_modules, settings
from tasks.settings import QUEUES

__all__ = ["api", "beat", "demo", "flower", "worker"]

PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


class Pool(StrEnum):
    asyncio = "asyncio"
    prefork = "prefork"
    threads = "threads"
    solo = "solo"


def worker(
    ctx: typer.Context,
    concurrency: Annotated[
        int | None,
        typer.Option(
            "--concurrency",
            "-c",
            min=1,
            help="Turns one worker process runs at once. [default: $RELAYQ_CONCURRENCY, "
            "else 500 with the asyncio pool, the CPU count with the others]",
            show_default=False,
        ),
    ] = None,
    pool: Annotated[
        Pool | None,
        typer.Option(
            "--pool",
            "-P",
            help="asyncio: many turns in one process; prefork: a process per turn. "
            "[default: $RELAYQ_POOL, else asyncio]",
            show_default=False,
        ),
    ] = None,
    loglevel: Annotated[str, typer.Option("--loglevel", "-l", help="Celery's log level.")] = "INFO",
    queues: Annotated[
        str | None,
        typer.Option(
            "--queues",
            "-Q",
            help=f"Comma-separated queues to consume. [default: all of {','.join(QUEUES)}]",
            show_default=False,
        ),
    ] = None,
    agents: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated modules that define the agents; sets RELAYQ_AGENTS. "
            "[default: $RELAYQ_AGENTS]",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Start a Celery worker that runs turns, answers and sweeps.

    It uses RELAYQ_BROKER_URL and RELAYQ_DATABASE_URL, or the embedded Redis
    and the SQLite file under RELAYQ_HOME (.relayq) when they are unset. Any
    other `celery worker` option goes through after `--`, e.g.
    `relayq worker -- --without-gossip -n w1@%h`.
    """
    _set_env(RELAYQ_AGENTS=agents, RELAYQ_CONCURRENCY=concurrency)
    if pool is not None:
        os.environ["RELAYQ_POOL"] = pool.value
    _check_setup()
    args = ["worker", "--loglevel", loglevel, *(["--queues", queues] if queues else [])]
    _start([*args, *ctx.args])


def beat(
    ctx: typer.Context,
    loglevel: Annotated[str, typer.Option("--loglevel", "-l", help="Celery's log level.")] = "INFO",
) -> None:
    """Start Celery beat: it schedules the sweep that re-sends lost messages and expires requests.

    One beat per deployment. Its schedule file goes to RELAYQ_HOME unless
    `-- --schedule PATH` says otherwise; other `celery beat` options go after `--`.
    """
    home = settings().home
    extra = list(ctx.args)
    if not any(a in ("-s", "--schedule") or a.startswith("--schedule=") for a in extra):
        home.mkdir(parents=True, exist_ok=True)
        extra = ["--schedule", str(home / "celerybeat-schedule"), *extra]
    _start(["beat", "--loglevel", loglevel, *extra])


def _set_env(**values: object) -> None:
    for name, value in values.items():
        if value is not None:
            os.environ[name] = str(value)


def _check_setup() -> None:
    """Fail here, in one line naming the variable, on settings the process would die of
    later in a traceback: a bad value or URL, an agent module that does not import, a
    database that does not answer. (A broker that does not answer is waited for.)"""
    current = settings()
    if current.agents:
        load_agent_modules(current)
    check_database(current)


def _check_tokens() -> None:
    """RELAYQ_API_TOKENS, parsed as the API will: one line naming the bad entry, never a token."""
    tokens = _load("api", "the API's tokens").Tokens
    try:
        tokens.parse(os.environ.get("RELAYQ_API_TOKENS", ""))
    except ValueError as exc:
        fail(str(exc))


def _start(argv: list[str]) -> None:
    try:
        # Reads the settings again, with a Celery config module's (CELERY_CONFIG_MODULE).
        from workers.__main__ import main as start_celery
    except ValueError as exc:
        fail(str(exc))
    start_celery(argv)


def api(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
) -> None:
    """Serve the HTTP API and the inbox (runs, requests, answers) with uvicorn."""
    _check_setup()
    _check_tokens()
    _load("api.server", "the API server").serve(host, port)


def mcp(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8100,
    stdio: Annotated[
        bool,
        typer.Option(
            "--stdio",
            help="Serve one client over stdin and stdout instead (logs on stderr), acting "
            "with RELAYQ_API_TOKEN; ends when stdin closes.",
        ),
    ] = False,
) -> None:
    """Serve each agent as an MCP tool, run_<agent>, over streamable HTTP at /mcp.

    It takes the API's tokens (RELAYQ_API_TOKENS) and seals requestState under
    RELAYQ_API_SECRET, which every relayq mcp process of a deployment must share.
    """
    _check_setup()
    _check_tokens()
    served = _load("api.mcp.serve", "the MCP server")
    if not stdio:
        served.serve(host, port)
        return
    try:
        served.stdio_principal()
    except ValueError as exc:
        fail(str(exc))
    served.serve_stdio()


def flower(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 5555,
) -> None:
    """Serve Flower, Celery's monitor, on the relayq broker (task events turn on while it runs)."""
    settings()
    try:
        _load("workers.flower", "Flower").run(port=port, address=host)
    except SystemExit as exc:
        if not isinstance(exc.code, str):
            raise
        fail(exc.code.removeprefix("relayq flower: "))  # its refusals, as every command's


def demo(
    keep: Annotated[
        bool,
        typer.Option(
            "--keep",
            help="Afterwards, keep the worker, the API and Flower running, with two refunds "
            "waiting in the inbox; print the inbox's address and an approver's token. "
            "Ctrl-C stops them all.",
        ),
    ] = False,
) -> None:
    """Run the refund demo: the `demo` agent, a lookup tool and an approval answered by you."""
    _load("cli.demo", "the demo").main(keep=keep)


def _load(module: str, what: str) -> Any:
    """Import `module` when its command runs; a missing piece is one line, not a traceback."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        fail(f"{what} cannot be loaded: {exc}")

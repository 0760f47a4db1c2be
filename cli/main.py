"""The `relayq` command line.

relayq worker --agents myagents      # run turns
relayq run support "refund order 17" # start a run and follow it
relayq pending                       # what runs wait on
relayq answer req_... --output ok    # answer, and the run goes on
relayq bulk --approve --tool refund  # decide every match, after a preview
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated

import typer

from cli import (
    approvals,
    batch,
    batches,
    grants,
    host,
    processes,
    purge,
    request_commands,
    runs,
)

__all__ = ["app", "main"]

app = typer.Typer(
    name="relayq",
    help=(
        "relayq: durable runs of LLM agents whose tools run somewhere else.\n\n"
        "Every command reads the same environment as the workers: RELAYQ_HOME (.relayq), "
        "RELAYQ_DATABASE_URL (SQLite under RELAYQ_HOME), RELAYQ_BROKER_URL (the embedded "
        "Redis), RELAYQ_KEY_PREFIX and RELAYQ_AGENTS (the modules that define the agents)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(shown: bool) -> None:
    if shown:
        try:
            typer.echo(f"relayq {version('relayq')}")
        except PackageNotFoundError:  # run from a checkout that was never installed
            typer.echo("relayq (not installed: no version)")
        raise typer.Exit()


@app.callback()
def _top(
    _: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_version,
            is_eager=True,
            help="Print relayq's version (the installed package's) and exit.",
        ),
    ] = False,
) -> None:
    """The options before any command (the help is the app's)."""


# Processes
app.command(context_settings=processes.PASS_THROUGH)(processes.worker)
app.command(context_settings=processes.PASS_THROUGH)(processes.beat)
app.command()(processes.api)
app.command()(processes.mcp)
app.command()(processes.flower)
app.command()(processes.demo)
# Runs
app.command()(runs.run)
app.command("host")(host.serve)
batch_app = typer.Typer(
    cls=batches.BatchGroup,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Run an agent once per job (`relayq batch AGENT JOBS.jsonl -o OUT`), or look after a "
    "batch: status, cancel, export.",
)
batch_app.command("start")(batch.batch)
batch_app.command()(batches.status)
batch_app.command()(batches.cancel)
batch_app.command()(batches.export)
app.add_typer(batch_app, name="batch")
app.command()(batches.batches)
app.command()(runs.runs)
app.command()(runs.show)
app.command()(runs.cancel)
# Requests
app.command()(request_commands.pending)
app.command()(request_commands.answer)
app.command()(approvals.bulk)
app.command()(approvals.audit)
grants_app = typer.Typer(
    no_args_is_help=False,
    invoke_without_command=True,
    rich_markup_mode=None,
    help="Standing grants: list them (`relayq grants`), make one (`add`), revoke one.",
)
grants_app.callback(invoke_without_command=True)(grants.listing)
grants_app.command()(grants.add)
grants_app.command()(grants.revoke)
app.add_typer(grants_app, name="grants")
app.command()(purge.purge)


def main() -> None:
    # Agent modules (RELAYQ_AGENTS) import from the current folder, as under `python -m workers`.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    app(prog_name="relayq")


if __name__ == "__main__":
    main()

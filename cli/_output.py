"""What a command says besides its output: one `relayq: error:` line and the exit, one
`relayq: warning:` line, and the console its output goes to."""

from __future__ import annotations

import os
from typing import NoReturn

import typer
from rich.console import Console

__all__ = ["EXIT_FAILED", "console", "fail", "warn"]

# Exit status of a command whose run ended badly (failed, cancelled, incomplete, timed out)
# or whose input was refused. Click keeps 2 for usage errors.
EXIT_FAILED = 1

# Wide enough for ids and a few columns when stdout is a pipe or a file.
PIPE_WIDTH = 160


def console() -> Console:
    """A console on the current stdout (CliRunner swaps it per invocation).

    Piped into grep or a file, tables keep their ids whole rather than fitting 80 columns.
    """
    out = Console(highlight=False, soft_wrap=True)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out.width = PIPE_WIDTH
    return out


def fail(message: str) -> NoReturn:
    """Print one `relayq: error: ...` line on stderr and exit non-zero."""
    line = " ".join(str(message).split())  # one line, whatever the message held
    typer.echo(f"relayq: error: {line}", err=True)
    raise typer.Exit(EXIT_FAILED)


def warn(message: str) -> None:
    """One `relayq: warning: ...` line on stderr."""
    typer.echo(f"relayq: warning: {' '.join(message.split())}", err=True)

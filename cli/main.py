"""The `relayq` command line (filled in by the CLI work)."""

from __future__ import annotations


def main() -> None:
    raise SystemExit("relayq: the command line is being built")

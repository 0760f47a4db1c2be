"""`relayq host`: serve relay tools from this machine (`relayq.hosts.RelayHost`).

    RELAYQ_API_URL=https://relayq.example.com RELAYQ_API_TOKEN=... \\
        relayq host --tool shell=mytools:run_shell --tool browser_click=mytools:click

Each `--tool NAME=module:function` names a relay tool and the function that runs it
(`function(arguments, call)`, sync or async, returning the output). The token is a
`host` token of the API whose entry names those tools. SIGTERM or Ctrl-C: no more
leases; the calls not started are handed back, the running ones end first.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import signal
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from cli._output import fail

if TYPE_CHECKING:
    from relayq.hosts import RelayHost, ToolFunction

__all__ = ["serve"]


def serve(
    tool: Annotated[
        list[str],
        typer.Option("--tool", "-t", help="NAME=module:function, once for each relay tool."),
    ],
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-c", min=1, help="Calls run at once.")
    ] = 8,
    lease_seconds: Annotated[
        float,
        typer.Option(min=1.0, max=3600.0, help="Seconds a call is held between heartbeats."),
    ] = 60.0,
) -> None:
    """Lease the calls of these relay tools from the API and run them here."""
    url = os.environ.get("RELAYQ_API_URL", "").strip()
    token = os.environ.get("RELAYQ_API_TOKEN", "").strip()
    if not url or not token:
        fail("relayq host needs RELAYQ_API_URL and RELAYQ_API_TOKEN (a host token)")
    # Imported here: every other command's start would pay for httpx.
    from relayq.hosts import HostRefused, RelayHost

    tools = dict(_tool(spec) for spec in tool)
    host = RelayHost(url, token, tools=tools, concurrency=concurrency, lease_seconds=lease_seconds)
    try:
        asyncio.run(_serve(host, sorted(tools)))
    except HostRefused as exc:
        fail(str(exc))


async def _serve(host: RelayHost, names: list[str]) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, host.stop)
    print(f"relayq host: serving {', '.join(names)}", file=sys.stderr, flush=True)
    await host.run()
    print(f"relayq host: stopped after {host.served} calls", file=sys.stderr, flush=True)


def _tool(spec: str) -> tuple[str, ToolFunction]:
    """`shell=mymodule:run_shell` as ("shell", run_shell); one error line if it is not."""
    name, _, target = spec.partition("=")
    module_name, _, attr = target.partition(":")
    if not name.strip() or not module_name or not attr:
        fail(f"--tool {spec!r}: write NAME=module:function")
    # Tool modules import from the current folder, as agent modules do.
    sys.path.insert(0, os.getcwd())
    try:
        function = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        fail(f"--tool {name}: cannot load {target}: {type(exc).__name__}: {exc}")
    if not callable(function):
        fail(f"--tool {name}: {target} is not a function")
    return name.strip(), function

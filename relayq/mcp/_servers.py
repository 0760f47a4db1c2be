"""Where an agent's MCP servers are, and which of their tools the host runs instead."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias
from urllib.parse import urlsplit, urlunsplit

from relayq._errors import ToolkitError

if TYPE_CHECKING:
    from relayq._tools import Tool

__all__ = ["MCPServer", "MCPServerHTTP", "MCPServerStdio"]

_PREFIX = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
_CONNECT = timedelta(seconds=10)
_CALL = timedelta(seconds=60)


@dataclass(frozen=True, eq=False)
class _Common(ABC):
    name: str | None
    """Prefixes the server's tool names (`fs` offers `read` as `fs_read`); unprefixed if None."""
    relay: tuple[str, ...]
    """Tools the host runs: offered to the model, called by no worker (their unprefixed
    names, as the server lists them)."""
    connect_timeout: timedelta
    """How long connecting and listing the tools may take."""
    call_timeout: timedelta
    """How long one call may wait for the server's reply (a silent server is given up on)."""
    resend: tuple[str, ...]
    """Tools safe to send again after a send that had no reply within `call_timeout`
    (their unprefixed names): it may still be running on the server. Any other tool's
    call that timed out is its error result, sent once; a call that could not be sent,
    or whose connection ended under it, is sent again whatever the tool."""
    wrap: Callable[[Tool], Tool] | None
    """A policy around each tool the server lists, as offered (say `requires_approval`
    for some of them); None: the tools as they are."""

    def _set_options(
        self,
        name: str | None,
        relay: Sequence[str],
        connect_timeout: timedelta,
        call_timeout: timedelta,
        wrap: Callable[[Tool], Tool] | None,
        resend: Sequence[str],
    ) -> None:
        """Set the options both kinds of server take, and check them."""
        _set(self, name=name, relay=_names(relay, "relay"), connect_timeout=connect_timeout)
        _set(self, call_timeout=call_timeout, wrap=wrap, resend=_names(resend, "resend"))
        if self.name is not None and not _PREFIX.match(self.name):
            raise ToolkitError(
                f"MCP server name {self.name!r} must be 1-32 letters, digits, '_' or '-'"
            )
        if self.wrap is not None and not callable(self.wrap):
            raise ToolkitError(f"MCP server {self.label}: wrap must be a function of a Tool")
        for bound in (self.connect_timeout, self.call_timeout):
            if not isinstance(bound, timedelta) or bound <= timedelta(0):
                raise ToolkitError(f"MCP server {self.label}: timeouts must be positive timedeltas")

    @property
    def label(self) -> str:
        """How errors and logs name the server: its name, else where it is."""
        return repr(self.name) if self.name is not None else self.where

    @property
    @abstractmethod
    def where(self) -> str:
        """Where the server is, shown without secrets."""

    def offered_name(self, tool: str) -> str:
        """The name the model sees for the server's `tool`."""
        return tool if self.name is None else f"{self.name}_{tool}"


@dataclass(frozen=True, eq=False, init=False)
class MCPServerHTTP(_Common):
    """An MCP server reached over streamable HTTP.

        MCPServerHTTP("https://tools.example.com/mcp", name="docs",
                      headers={"Authorization": f"Bearer {os.environ['DOCS_TOKEN']}"})

    # a person approves each call of its `delete` first
    MCPServerHTTP(url, name="fs",
                  wrap=lambda t: requires_approval(t) if t.name == "fs_delete" else t)

    Headers are sent with every request and never logged or shown.
    """

    url: str
    headers: tuple[tuple[str, str], ...] = field(repr=False)

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        name: str | None = None,
        relay: Sequence[str] = (),
        connect_timeout: timedelta = _CONNECT,
        call_timeout: timedelta = _CALL,
        wrap: Callable[[Tool], Tool] | None = None,
        resend: Sequence[str] = (),
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ToolkitError(f"MCP server URL must start with http:// or https://, not {url!r}")
        _set(self, url=url, headers=tuple(sorted((headers or {}).items())))
        self._set_options(name, relay, connect_timeout, call_timeout, wrap, resend)

    @property
    def where(self) -> str:
        """The URL without its query or any user and password."""
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port is not None else host
        return urlunsplit((parts.scheme, netloc, parts.path, "", ""))

    def __repr__(self) -> str:
        return f"MCPServerHTTP({self.where!r}, name={self.name!r})"


@dataclass(frozen=True, eq=False, init=False)
class MCPServerStdio(_Common):
    """An MCP server the worker starts as a subprocess and talks to over its stdin and stdout.

        MCPServerStdio("python", args=["-m", "my_tools"], env={"TOOLS_HOME": "/srv"})

    Each worker process starts its own, and stops it as it stops. `env` is added to the
    SDK's default environment (not the worker's whole one), and never logged or shown.
    """

    command: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = field(repr=False)
    cwd: str | None
    """The folder it starts in; the worker's own if None."""

    def __init__(
        self,
        command: str,
        *,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        name: str | None = None,
        relay: Sequence[str] = (),
        connect_timeout: timedelta = _CONNECT,
        call_timeout: timedelta = _CALL,
        wrap: Callable[[Tool], Tool] | None = None,
        resend: Sequence[str] = (),
    ) -> None:
        if not isinstance(command, str) or not command:
            raise ToolkitError(f"MCP server command must be a program, not {command!r}")
        _set(self, command=command, args=tuple(args), env=tuple(sorted((env or {}).items())))
        _set(self, cwd=None if cwd is None else str(cwd))
        self._set_options(name, relay, connect_timeout, call_timeout, wrap, resend)

    @property
    def where(self) -> str:
        return " ".join([self.command, *self.args])

    def __repr__(self) -> str:
        return f"MCPServerStdio({self.command!r}, name={self.name!r})"


MCPServer: TypeAlias = MCPServerHTTP | MCPServerStdio


def _names(names: Sequence[str], option: str) -> tuple[str, ...]:
    # A lone name would be a list of its letters to `tuple()`: refused, not split.
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise ToolkitError(f"MCP server {option} must be a list of tool names, not {names!r}")
    return tuple(names)


def _set(obj: object, **values: object) -> None:
    for key, value in values.items():
        object.__setattr__(obj, key, value)

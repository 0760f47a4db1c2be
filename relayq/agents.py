"""Agents: a named model, toolkit and limits that any process can look up.

A closure cannot travel to another process, so a durable run names its agent.
Workers import the modules listed in `RELAYQ_AGENTS`; every `Agent` built at
module level registers itself under its name.

    # myagents.py
    from relayq import Agent
    from relayq.relay import relay_tool

    support = Agent("support", my_generate, tools=[relay_tool("refund", "Refund an order")])

Defining the same agent again is not an error: a module imported under two
names (`python -m myagents`, then `import myagents`) or reloaded runs its
`Agent(...)` lines twice, and the newer object takes the name. A different
definition under a taken name is an `AgentError`.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable, Sequence
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from relayq._errors import RelayqError
from relayq._toolkit import Toolkit, create_toolkit
from relayq._tools import Tool
from relayq._types import Usage
from relayq.budgets import Budget
from relayq.builtins import BuiltinsConfig
from relayq.mcp import MCPServer, MCPServerHTTP, MCPServerStdio, mcp_tools
from relayq.model import Generate, Model, as_model
from relayq.providers import ProviderConfig, ProviderModel

__all__ = [
    "DEFAULT_QUEUE",
    "Agent",
    "AgentError",
    "OnExpiry",
    "get_agent",
    "load_agents",
    "registered_agents",
]

DEFAULT_QUEUE = "relayq.turns"
"""The Celery queue an agent's turns go to unless it names another."""

OnExpiry = Literal["error", "cancel"]

_REGISTRY: dict[str, Agent] = {}


class AgentError(RelayqError):
    """An agent is unknown, defined twice, or cannot serve a run."""

    def __init__(self, message: str, agent: str | None = None) -> None:
        super().__init__(message, agent)
        self.message = message
        self.agent = agent

    def __str__(self) -> str:
        return self.message


class Agent:
    """A model with its tools and limits, registered under `name`.

    `model` is a `generate(InProcessRequest) -> InProcessResponse` function
    (sync or async), or a `ProviderConfig` naming an endpoint and the variable
    that holds its key (so no secret is stored or sent through the broker).
    Builtins are off unless asked for: a worker is shared infrastructure, and
    a shell on it is a choice. `mcp_servers` adds the tools of MCP servers
    (`relayq.mcp`).

    Three keywords set the agent's policy on the workers: `retries` and
    `turn_time_limit` default to the worker's settings, `queue` to `relayq.turns`;
    `tool_timeout` bounds each call of its tools that sets no `timeout` of its own.
    `budget` caps what each of its runs may spend, unless a run is given its own.

        Agent("support", generate, retries=2, turn_time_limit=timedelta(minutes=2),
              queue="relayq.turns.support")  # python -m workers -Q relayq.turns.support
    """

    def __init__(
        self,
        name: str,
        model: Generate | ProviderConfig,
        *,
        tools: Sequence[Tool] = (),
        mcp_servers: Sequence[MCPServer] = (),
        builtins: BuiltinsConfig | None = None,
        system_prompt: str | None = None,
        max_turns: int = 10,
        request_ttl: timedelta | None = None,
        on_expiry: OnExpiry = "error",
        base_dir: str | Path | None = None,
        model_name: str = "in-process",
        retries: int | None = None,
        turn_time_limit: timedelta | None = None,
        tool_timeout: timedelta | None = None,
        queue: str = DEFAULT_QUEUE,
        budget: Budget | None = None,
        hooks: Sequence[object] = (),
        register: bool = True,
    ) -> None:
        if max_turns < 1:
            raise AgentError(f"agent {name!r}: max_turns must be at least 1", name)
        if on_expiry not in ("error", "cancel"):
            raise AgentError(f"agent {name!r}: on_expiry must be 'error' or 'cancel'", name)
        _check_policy(name, retries, turn_time_limit, queue)
        _check_positive(name, "tool_timeout", tool_timeout)
        self.name = name
        self.tools = tuple(tools)
        self.mcp_servers = _mcp_servers(name, mcp_servers)
        """MCP servers whose tools it offers too (`relayq.mcp`)."""
        self.builtins = builtins if builtins is not None else BuiltinsConfig.off()
        self.system_prompt = system_prompt
        self.max_turns = max_turns
        self.request_ttl = request_ttl
        self.on_expiry: OnExpiry = on_expiry
        self.base_dir = Path(base_dir) if base_dir is not None else None
        self.retries = retries
        """Retries of a failing model call before the run fails; None: the worker's
        `RELAYQ_MODEL_RETRIES`."""
        self.turn_time_limit = turn_time_limit
        """How long one turn may take; None: the worker's `RELAYQ_TURN_TIME_LIMIT`. It must
        stay below that limit (Celery's soft limit), which a worker checks at start."""
        self.tool_timeout = tool_timeout
        """How long a call of one of its local tools may take, unless the tool sets its
        own `timeout`: past it, the call's result is an error saying so. None: only the
        turn's time limit bounds it."""
        self.queue = queue
        """The Celery queue this agent's turns go to; a worker serves it when started with
        `-Q` naming it."""
        self.budget = budget
        """What each run may spend unless it is given its own budget (`relayq.budgets`)."""
        self.hooks: tuple[Any, ...] = tuple(hooks)
        """Hooks (`tasks.hooks.RunHooks`) the events of this agent's durable runs also go
        to, after the worker's own; a worker checks them at start."""
        self._site = _definition_site()
        self.provider: ProviderModel | None = None
        if isinstance(model, ProviderConfig):
            self.provider = ProviderModel(model)
            self.model: Model = self.provider
            self.model_name = model.model
        else:
            self.model = as_model(model)
            self.model_name = model_name
        # Worker turns fail fast on a provider error; the task retries with backoff.
        self.durable_model: Model = (
            self.provider.without_retries() if self.provider is not None else self.model
        )
        self._toolkit: Toolkit | None = None
        self._listings: tuple[object, ...] = ()
        if register:
            _register(self)

    async def toolkit(self) -> Toolkit:
        """The agent's toolkit, built once (a race builds it twice, harmlessly), and again
        when an MCP server's tools are listed anew (a new connection lists them)."""
        if self._toolkit is not None and not self.mcp_servers:
            return self._toolkit  # every turn asks: no work where nothing can change
        extra = list(self.tools)
        listings: list[object] = []
        for server in self.mcp_servers:
            listing, tools = await mcp_tools(server)
            listings.append(listing)
            extra.extend(tools)
        if self._toolkit is None or not _same(listings, self._listings):
            self._toolkit = await create_toolkit(
                builtins=self.builtins, extra_tools=extra, base_dir=self.base_dir
            )
            self._listings = tuple(listings)
        return self._toolkit

    def cost_of(self, usage: Usage) -> float | None:
        """What `usage` of this agent's model cost, by its provider's prices; None without."""
        return self.provider.config.cost_of(usage) if self.provider is not None else None

    def __repr__(self) -> str:
        return f"Agent({self.name!r})"


class UnknownAgent(AgentError):
    """No agent has this name in this process (its module is not among `RELAYQ_AGENTS`)."""

    def __init__(self, name: str, known: tuple[str, ...] = ()) -> None:
        listed = ", ".join(known) or "none"
        super().__init__(
            f"unknown agent {name!r} (registered: {listed}); "
            "list the module that defines it in RELAYQ_AGENTS",
            name,
        )
        self.args = (name, known)
        self.known = known


def _check_policy(
    name: str, retries: int | None, turn_time_limit: timedelta | None, queue: str
) -> None:
    if retries is not None and (isinstance(retries, bool) or retries < 0):
        raise AgentError(f"agent {name!r}: retries must be 0 or more, not {retries!r}", name)
    _check_positive(name, "turn_time_limit", turn_time_limit)
    # `-Q` takes a comma-separated list: a queue name cannot hold a comma or a space.
    if not isinstance(queue, str) or not queue or any(c in queue for c in ", \t\n"):
        raise AgentError(f"agent {name!r}: queue must be a queue name, not {queue!r}", name)


def _check_positive(name: str, what: str, value: timedelta | None) -> None:
    if value is not None and (not isinstance(value, timedelta) or value <= timedelta(0)):
        raise AgentError(
            f"agent {name!r}: {what} must be a positive timedelta, not {value!r}", name
        )


def _mcp_servers(name: str, servers: Sequence[MCPServer]) -> tuple[MCPServer, ...]:
    if isinstance(servers, MCPServerHTTP | MCPServerStdio) or not all(
        isinstance(s, MCPServerHTTP | MCPServerStdio) for s in servers
    ):
        raise AgentError(
            f"agent {name!r}: mcp_servers must be a list of MCPServerHTTP or MCPServerStdio",
            name,
        )
    prefixes = [s.name for s in servers if s.name is not None]
    if len(set(prefixes)) != len(prefixes):
        raise AgentError(f"agent {name!r}: two of its MCP servers have one name", name)
    return tuple(servers)


def _same(listings: list[object], before: tuple[object, ...]) -> bool:
    if len(listings) != len(before):
        return False
    return all(a is b for a, b in zip(listings, before, strict=True))


def _definition_site() -> tuple[tuple[str, int], ...]:
    """Where `Agent(...)` was called: the calling lines up to the module's top level.

    The same lines run again when a module is imported under a second name or
    reloaded; another definition (another line, or a factory called from
    another line) has other lines.
    """
    here = __file__
    frame: FrameType | None = sys._getframe(1)
    site: list[tuple[str, int]] = []
    while frame is not None and len(site) < 64:
        code = frame.f_code
        if code.co_filename != here:
            site.append((code.co_filename, frame.f_lineno))
            if code.co_name == "<module>":
                break
        frame = frame.f_back
    return tuple(site)


def _register(agent: Agent) -> None:
    existing = _REGISTRY.get(agent.name)
    if existing is not None and existing is not agent and existing._site != agent._site:
        raise AgentError(
            f"two agents are named {agent.name!r} (defined at {_where(existing)} and at "
            f"{_where(agent)}); agent names must be unique",
            agent.name,
        )
    _REGISTRY[agent.name] = agent


def _where(agent: Agent) -> str:
    if not agent._site:
        return "?"
    path, line = agent._site[-1]
    return f"{Path(path).name}:{line}"


def get_agent(name: str) -> Agent:
    """The registered agent called `name`; UnknownAgent lists the known ones if absent."""
    agent = _REGISTRY.get(name)
    if agent is None:
        raise UnknownAgent(name, tuple(sorted(_REGISTRY)))
    return agent


def registered_agents() -> dict[str, Agent]:
    return dict(_REGISTRY)


def load_agents(modules: str | Iterable[str]) -> list[Agent]:
    """Import agent modules (comma-separated or a list) and return what they registered."""
    names = modules.split(",") if isinstance(modules, str) else list(modules)
    before = set(_REGISTRY)
    for module in (n.strip() for n in names):
        if not module:
            continue
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise AgentError(f"cannot import agent module {module!r}: {exc}") from exc
    return [a for n, a in _REGISTRY.items() if n not in before]

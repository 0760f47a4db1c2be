"""Agents: a named model, toolkit and limits that any process can look up.

A closure cannot travel to another process, so a durable run names its agent.
Workers import the modules listed in `RELAYQ_AGENTS`; every `Agent` built at
module level registers itself under its name.

    # myagents.py
    from relayq import Agent
    from relayq.relay import relay_tool

    support = Agent("support", my_generate, tools=[relay_tool("refund", "Refund an order")])
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Literal

from relayq._errors import RelayqError
from relayq._model import Generate, Model, as_model
from relayq._toolkit import Toolkit, create_toolkit
from relayq._tools import Tool
from relayq.builtins import BuiltinsConfig
from relayq.providers import ProviderConfig, ProviderModel

__all__ = ["Agent", "AgentError", "OnExpiry", "get_agent", "load_agents", "registered_agents"]

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
    a shell on it is a choice.
    """

    def __init__(
        self,
        name: str,
        model: Generate | ProviderConfig,
        *,
        tools: Sequence[Tool] = (),
        builtins: BuiltinsConfig | None = None,
        system_prompt: str | None = None,
        max_turns: int = 10,
        request_ttl: timedelta | None = None,
        on_expiry: OnExpiry = "error",
        base_dir: str | Path | None = None,
        model_name: str = "in-process",
        register: bool = True,
    ) -> None:
        if max_turns < 1:
            raise AgentError(f"agent {name!r}: max_turns must be at least 1", name)
        if on_expiry not in ("error", "cancel"):
            raise AgentError(f"agent {name!r}: on_expiry must be 'error' or 'cancel'", name)
        self.name = name
        self.tools = tuple(tools)
        self.builtins = builtins if builtins is not None else BuiltinsConfig.off()
        self.system_prompt = system_prompt
        self.max_turns = max_turns
        self.request_ttl = request_ttl
        self.on_expiry: OnExpiry = on_expiry
        self.base_dir = Path(base_dir) if base_dir is not None else None
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
        if register:
            _register(self)

    async def toolkit(self) -> Toolkit:
        """The agent's toolkit, built once (a race builds it twice, harmlessly)."""
        if self._toolkit is None:
            self._toolkit = await create_toolkit(
                builtins=self.builtins, extra_tools=self.tools, base_dir=self.base_dir
            )
        return self._toolkit

    def __repr__(self) -> str:
        return f"Agent({self.name!r})"


def _register(agent: Agent) -> None:
    existing = _REGISTRY.get(agent.name)
    if existing is not None and existing is not agent:
        raise AgentError(
            f"two agents are named {agent.name!r}; agent names must be unique", agent.name
        )
    _REGISTRY[agent.name] = agent


def get_agent(name: str) -> Agent:
    """The registered agent called `name`; AgentError lists the known ones if absent."""
    agent = _REGISTRY.get(name)
    if agent is None:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise AgentError(
            f"unknown agent {name!r} (registered: {known}); "
            "list the module that defines it in RELAYQ_AGENTS",
            name,
        )
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

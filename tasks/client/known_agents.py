"""The agents a client knows by name, to start their runs on their own queues."""

from __future__ import annotations

from relayq.agents import Agent, load_agents, registered_agents

__all__ = ["KnownAgents"]


class KnownAgents:
    """`known(name)`: the agent registered as `name` in this process, if any."""

    def __init__(self, modules: str) -> None:
        self.modules = modules
        """`RELAYQ_AGENTS`: the comma-separated modules that define the agents."""
        self._loaded = False

    def __call__(self, name: str) -> Agent | None:
        """The agent registered as `name`, importing `RELAYQ_AGENTS` the first time one is
        missing (so a run started by name goes to its agent's queue)."""
        found = registered_agents().get(name)
        if found is None and self.modules and not self._loaded:
            self._loaded = True
            load_agents(self.modules)
            found = registered_agents().get(name)
        return found

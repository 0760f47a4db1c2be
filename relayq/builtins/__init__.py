"""The builtin tools: shell, files, web, and asking the host.

    tools = builtin_tools(BuiltinsConfig.only("read", "grep"))

File tools stay inside `ToolContext.base_dir`, read at call time, so one set of
tools serves every run. Expected failures come back as error results the model
can read; no exception reaches the loop.
"""

from __future__ import annotations

from collections.abc import Callable

from relayq._tools import Tool
from relayq.builtins._bash import bash_tool
from relayq.builtins._config import BASH_ENV_NAMES, BUILTIN_NAMES, BuiltinsConfig
from relayq.builtins._files import edit_tool, read_tool, write_tool
from relayq.builtins._host import question_tool, todowrite_tool
from relayq.builtins._patch import apply_patch_tool

__all__ = [
    # configuration
    "BASH_ENV_NAMES",
    "BUILTIN_NAMES",
    "BuiltinsConfig",
    # construction
    "builtin_tools",
]


# The web and search builtins import httpx (and, through it, rich and pygments) and regex:
# 0.3 s of every process's start. Only a process whose agents enable them pays for it.
def _grep_tool(config: BuiltinsConfig) -> Tool:
    from relayq.builtins._search import grep_tool

    return grep_tool(config)


def _glob_tool(config: BuiltinsConfig) -> Tool:
    from relayq.builtins._search import glob_tool

    return glob_tool(config)


def _webfetch_tool(config: BuiltinsConfig) -> Tool:
    from relayq.builtins._web import webfetch_tool

    return webfetch_tool(config)


_FACTORIES: dict[str, Callable[[BuiltinsConfig], Tool]] = {
    "bash": bash_tool,
    "read": read_tool,
    "write": write_tool,
    "edit": edit_tool,
    "grep": _grep_tool,
    "glob": _glob_tool,
    "webfetch": _webfetch_tool,
    "question": question_tool,
    "apply_patch": apply_patch_tool,
    "todowrite": todowrite_tool,
}


def builtin_tools(config: BuiltinsConfig) -> list[Tool]:
    """The enabled builtins, in `BUILTIN_NAMES` order."""
    return [_FACTORIES[name](config) for name in BUILTIN_NAMES if name in config.enabled]

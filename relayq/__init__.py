"""relayq: a durable runtime for LLM agents whose tools run somewhere else.

The pure core: tools, toolkits, the suspension primitive, relay tools and the
agent loop. It imports no broker, database or task queue.
"""

from relayq._errors import ModelError, RelayqError, ResumeError, RunCancelled, ToolkitError
from relayq._model import InProcessRequest, InProcessResponse, InProcessToolCall
from relayq._toolkit import Toolkit, create_toolkit
from relayq._tools import Tool, ToolContext, define_tool, tool
from relayq._types import (
    Answer,
    Request,
    RunResult,
    ToolCallRecord,
    ToolResult,
    Usage,
    pending,
)
from relayq.agents import Agent, AgentError
from relayq.builtins import BUILTIN_NAMES, BuiltinsConfig
from relayq.client import InMemoryConversationStore, create_in_process_client

__all__ = [
    # Tools and toolkits
    "BUILTIN_NAMES",
    # Suspension and results
    "Answer",
    "BuiltinsConfig",
    # Running
    "Agent",
    "InMemoryConversationStore",
    "InProcessRequest",
    "InProcessResponse",
    "InProcessToolCall",
    # Errors
    "AgentError",
    "ModelError",
    "RelayqError",
    "Request",
    "ResumeError",
    "RunCancelled",
    "RunResult",
    "Tool",
    "ToolCallRecord",
    "ToolContext",
    "ToolResult",
    "Toolkit",
    "ToolkitError",
    "Usage",
    "create_in_process_client",
    "create_toolkit",
    "define_tool",
    "pending",
    "tool",
]

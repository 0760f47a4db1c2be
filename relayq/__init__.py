"""relayq: a durable runtime for LLM agents whose tools run somewhere else.

The pure core: tools, toolkits, the suspension primitive, relay tools and the
agent loop. It imports no broker, database or task queue.
"""

from relayq._errors import (
    AlreadyVoted,
    AnswerMismatch,
    AnswerTooLarge,
    BulkRefused,
    CallAnswered,
    ConversationBusy,
    ConversationPurged,
    InputTooLarge,
    ModelError,
    NotAnApproval,
    NotAnApprover,
    RelayqError,
    RequestClosed,
    ResumeError,
    RunCancelled,
    ToolkitError,
    UnknownRequest,
    UnstorableAnswer,
    UnstorableInput,
)
from relayq._toolkit import Toolkit, create_toolkit
from relayq._tools import Tool, ToolContext, define_tool, tool
from relayq._types import (
    Answer,
    Request,
    RunResult,
    ToolCallRecord,
    ToolResult,
    Usage,
    new_id,
    pending,
)
from relayq.agents import Agent, AgentError, UnknownAgent
from relayq.budgets import Budget
from relayq.builtins import BUILTIN_NAMES, BuiltinsConfig
from relayq.client import InMemoryConversationStore, create_in_process_client
from relayq.model import InProcessRequest, InProcessResponse, InProcessToolCall

__all__ = [
    # Tools and toolkits
    "BUILTIN_NAMES",
    "BuiltinsConfig",
    "Tool",
    "ToolContext",
    "Toolkit",
    "create_toolkit",
    "define_tool",
    "tool",
    # Suspension and results
    "Answer",
    "Request",
    "RunResult",
    "ToolCallRecord",
    "ToolResult",
    "Usage",
    "new_id",
    "pending",
    # Running
    "Agent",
    "Budget",
    "InMemoryConversationStore",
    "InProcessRequest",
    "InProcessResponse",
    "InProcessToolCall",
    "create_in_process_client",
    # Errors
    "AgentError",
    "AlreadyVoted",
    "AnswerMismatch",
    "AnswerTooLarge",
    "BulkRefused",
    "CallAnswered",
    "ConversationBusy",
    "ConversationPurged",
    "InputTooLarge",
    "ModelError",
    "NotAnApproval",
    "NotAnApprover",
    "RelayqError",
    "RequestClosed",
    "ResumeError",
    "RunCancelled",
    "ToolkitError",
    "UnknownAgent",
    "UnknownRequest",
    "UnstorableAnswer",
    "UnstorableInput",
]

"""The public names are a contract, and the core imports no infrastructure."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import relayq
import relayq.client
import relayq.relay

FORBIDDEN = ("celery", "kombu", "redis", "sqlalchemy", "sqlmodel", "alembic", "billiard")
CORE = Path(relayq.__file__).parent


def test_the_package_exports_exactly_these_names():
    assert sorted(relayq.__all__) == sorted(
        [
            "Agent", "AgentError", "Answer", "BUILTIN_NAMES", "Budget", "BuiltinsConfig",
            "InMemoryConversationStore",
            "InProcessRequest", "InProcessResponse", "InProcessToolCall", "ModelError",
            "RelayqError", "Request", "ResumeError", "RunCancelled", "RunResult", "Tool",
            "ToolCallRecord", "ToolContext", "ToolResult", "Toolkit", "ToolkitError", "Usage",
            "create_in_process_client", "create_toolkit", "define_tool", "new_id", "pending",
            "tool",
            "AlreadyVoted", "AnswerMismatch", "AnswerTooLarge", "BulkRefused", "CallAnswered",
            "ConversationBusy",
            "ConversationPurged",
            "InputTooLarge", "NotAnApproval", "NotAnApprover", "RequestClosed", "UnknownAgent",
            "UnknownRequest",
            "UnstorableAnswer", "UnstorableInput",
        ]
    )  # fmt: skip
    assert all(hasattr(relayq, name) for name in relayq.__all__)


def test_the_relay_and_client_modules_export_their_contract_names():
    assert {
        "RELAY_KIND", "RelayCall", "RelayResult", "answer_declined", "answer_output",
        "is_relay_request", "relay_answer", "relay_calls_of", "relay_tool",
    } <= set(relayq.relay.__all__)  # fmt: skip
    assert {
        "InMemoryConversationStore", "InProcessRequest", "InProcessResponse",
        "InProcessToolCall", "create_in_process_client",
    } <= set(relayq.client.__all__)  # fmt: skip
    assert relayq.relay.RELAY_KIND == "tool_call"


def test_the_mcp_module_exports_its_servers_and_imports_the_sdk_only_when_used():
    code = (
        "import sys, relayq, relayq.mcp; "
        "print(sorted(relayq.mcp.__all__), 'mcp' in sys.modules, "
        "issubclass(relayq.mcp.MCPError, relayq.RelayqError))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == [
        "['MCPError',", "'MCPServer',", "'MCPServerHTTP',", "'MCPServerStdio',",
        "'check_servers',", "'mcp_tools']", "False", "True",
    ]  # fmt: skip


def test_errors_share_one_root():
    for name in ("AgentError", "ModelError", "ResumeError", "RunCancelled", "ToolkitError"):
        assert issubclass(getattr(relayq, name), relayq.RelayqError)


def test_no_core_module_imports_infrastructure():
    offenders = []
    for path in CORE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert offenders == []


def test_importing_the_core_loads_no_infrastructure_module():
    code = (
        "import sys, relayq, relayq.relay, relayq.client, relayq.loop\n"
        f"bad = [m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r}]\n"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""

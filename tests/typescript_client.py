"""The official TypeScript SDK's MCP client (tests/clients/typescript), driven from a test:
one call per process, each line it prints a JSON object (`drive.mjs` says which).

`make test` installs its packages (`npm ci`, from the lock beside it); where Node.js or
they are missing, the `typescript` fixture skips the test, or fails it where
`RELAYQ_REQUIRE` names `node`.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

__all__ = ["CLIENTS", "TypeScriptClient", "missing"]

CLIENTS = Path(__file__).parent / "clients" / "typescript"


def missing() -> str | None:
    """Why the client cannot run here, or None."""
    if shutil.which("node") is None:
        return "no node on PATH (Node.js 18 or later)"
    if not (CLIENTS / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        return f"the TypeScript SDK is not installed in {CLIENTS} (make test runs npm ci there)"
    return None


class TypeScriptClient:
    async def call(self, plan: dict[str, Any], *, timeout: float = 150) -> list[dict[str, Any]]:
        """What the client printed for one call made as `plan` says."""
        proc = await asyncio.create_subprocess_exec(
            "node", str(CLIENTS / "drive.mjs"), json.dumps(plan),
            cwd=CLIENTS, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        lines = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
        assert lines, f"the TypeScript client printed nothing; stderr:\n{err.decode()[-3000:]}"
        return lines

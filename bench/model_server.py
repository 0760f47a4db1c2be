"""A model server for benchmarks: OpenAI chat completions, answering after a fixed latency.

    python -m bench.model_server --port 8765 --latency 1.0 --turns 5

Each reply asks for the `step` tool until the conversation holds `turns - 1`
tool results, then gives a final answer: a run is exactly `turns` model calls.

With `--limit-rps N` it enforces a rate limit as providers do (Anthropic documents
a token bucket): a bucket of N requests, refilled N a second; a call that finds
it empty is answered 429 with `Retry-After` (whole seconds). `GET /stats` says
how many calls it answered and refused, and when the first and last answered
ones arrived (seconds on the server's clock).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


class Bucket:
    """A token bucket: `rate` requests a second, up to `rate` saved up."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.tokens = rate
        self.last = time.monotonic()

    def take(self) -> float | None:
        """None if the request may go; else seconds until it could."""
        now = time.monotonic()
        self.tokens = min(self.rate, self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens >= 1:
            self.tokens -= 1
            return None
        return (1 - self.tokens) / self.rate


class Stats:
    def __init__(self) -> None:
        self.answered = 0
        self.refused = 0
        self.first: float | None = None
        self.last: float | None = None

    def ok(self) -> None:
        now = time.monotonic()
        self.answered += 1
        self.first = now if self.first is None else self.first
        self.last = now


def app(latency: float, turns: int, limit_rps: float = 0.0) -> Starlette:
    bucket = Bucket(limit_rps) if limit_rps > 0 else None
    stats = Stats()

    async def stats_page(request: Request) -> JSONResponse:
        return JSONResponse(vars(stats))

    async def completions(request: Request) -> JSONResponse:
        body = json.loads(await request.body())
        wait = bucket.take() if bucket is not None else None
        if wait is not None:
            stats.refused += 1
            return JSONResponse(
                {"error": {"type": "rate_limit_error", "message": "rate limit exceeded"}},
                status_code=429,
                headers={"retry-after": str(math.ceil(wait))},
            )
        stats.ok()
        done = sum(1 for m in body["messages"] if m["role"] == "tool")
        await asyncio.sleep(latency)
        if done < turns - 1:
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{done}",
                        "type": "function",
                        "function": {"name": "step", "arguments": json.dumps({"n": done})},
                    }
                ],
            }
            finish = "tool_calls"
        else:
            message = {"role": "assistant", "content": f"finished after {done} steps"}
            finish = "stop"
        return JSONResponse(
            {
                "id": "bench",
                "object": "chat.completion",
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            }
        )

    return Starlette(
        routes=[
            Route("/v1/chat/completions", completions, methods=["POST"]),
            Route("/stats", stats_page, methods=["GET"]),
        ]
    )


ROOT = Path(__file__).resolve().parents[1]


class ServerProcess:
    """This server in a process of its own on `port`, which a benchmark or a test may kill
    (SIGKILL: the provider gone, connections refused) and start again on the same port.

        server = ServerProcess(port, "--latency", "0.1", "--turns", "3").start()
        server.kill(); ...; server.start()
    """

    def __init__(self, port: int, *options: str) -> None:
        self.port = port
        self.options = options
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The OpenAI-style base URL."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 20.0) -> ServerProcess:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.model_server", "--port", str(self.port), *self.options],
            cwd=ROOT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.stats()
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the model server did not start") from None
                time.sleep(0.05)

    def stats(self) -> dict[str, float | int | None]:
        """What it answered since it started (`GET /stats`)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/stats", timeout=5) as reply:
            found: dict[str, float | int | None] = json.load(reply)
            return found

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--limit-rps", type=float, default=0.0, help="0: no limit")
    args = parser.parse_args()
    uvicorn.run(
        app(args.latency, args.turns, args.limit_rps),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        backlog=4096,
        limit_concurrency=None,
    )


if __name__ == "__main__":
    main()

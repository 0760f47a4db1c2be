"""A model server for benchmarks: OpenAI chat completions, answering after a fixed latency.

    python -m bench.model_server --port 8765 --latency 1.0 --turns 5

Each reply asks for the `step` tool until the conversation holds `turns - 1`
tool results, then gives a final answer: a run is exactly `turns` model calls.
"""

from __future__ import annotations

import argparse
import asyncio
import json

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


def app(latency: float, turns: int) -> Starlette:
    async def completions(request: Request) -> JSONResponse:
        body = json.loads(await request.body())
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

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--turns", type=int, default=5)
    args = parser.parse_args()
    uvicorn.run(
        app(args.latency, args.turns),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        backlog=4096,
        limit_concurrency=None,
    )


if __name__ == "__main__":
    main()

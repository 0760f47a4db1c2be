"""A crowd of callers in one process, all asking the shared limiter at once.

    python -m tests.tasks.limiter_crowd URL PREFIX KEY CALLERS --rpm 6000 --in-flight 3

Each caller acquires, counts itself in `{PREFIX}holding` while it holds its
permit (the highest count it saw is the peak), and releases. Every process
waits for `{PREFIX}go` before its callers start, so the processes start as one.
Prints `{"peak": ..., "granted": ...}`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random

import redis.asyncio as aioredis

from relayq.ratelimit import ProviderLimits
from tasks.broker.limiter import RedisLimiter


async def crowd(args: argparse.Namespace) -> dict[str, int]:
    limiter = RedisLimiter(args.url, prefix=args.prefix)
    limits = ProviderLimits(
        key=args.key,
        label=f"crowd/{args.key}",
        requests_per_minute=args.rpm,
        max_in_flight=args.in_flight,
    )
    peak = granted = 0

    async def one() -> None:
        nonlocal peak, granted
        permit = await limiter.acquire(limits, prompt_tokens=1, max_wait=120)
        granted += 1
        peak = max(peak, int(await r.incr(args.prefix + "holding")))
        await asyncio.sleep(random.uniform(0, 0.005))
        await r.decr(args.prefix + "holding")
        await limiter.release(permit, used=None)

    async with aioredis.Redis.from_url(args.url) as r:  # closed on every path
        try:
            await r.incr(args.prefix + "ready")
            while not await r.exists(args.prefix + "go"):  # noqa: ASYNC110 (another process says when)
                await asyncio.sleep(0.005)
            await asyncio.gather(*(one() for _ in range(args.callers)))
        finally:
            await limiter.aclose()
    return {"peak": peak, "granted": granted}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("prefix")
    parser.add_argument("key")
    parser.add_argument("callers", type=int)
    parser.add_argument("--rpm", type=int, default=None)
    parser.add_argument("--in-flight", type=int, default=None)
    print(json.dumps(asyncio.run(crowd(parser.parse_args()))))


if __name__ == "__main__":
    main()

"""Relay tools a `relayq host` process serves in the tests
(`--tool shell=tests.durable.host_tools:shell`).

Each execution is logged (`host.log` under RELAYQ_TEST_LOG: the call's key and the
host's pid), so a test can tell a call run twice from one run again as a new attempt.
A command `sleep N ...` holds the call's first attempt N seconds (a host killed while
it runs); a later attempt runs at once. `flood N` returns N bytes (a result too large),
`surrogate` a text with a lone surrogate (no UTF-8 encodes it), `unprintable` a value
whose text raises.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from relayq.hosts import LeasedCall


def shell(arguments: dict[str, Any], call: LeasedCall) -> str:
    command = str(arguments.get("cmd", ""))
    log = Path(os.environ["RELAYQ_TEST_LOG"]) / "host.log"
    with log.open("a") as out:
        out.write(f"{call.run_id} {call.call_id} {call.attempt} {os.getpid()}\n")
    words = command.split()
    if len(words) >= 2 and words[0] == "sleep" and call.attempt == 1:
        time.sleep(float(words[1]))
    if len(words) == 2 and words[0] == "flood":
        return "x" * int(words[1])
    if command == "surrogate":
        return "half a pair: \ud800"
    if command == "unprintable":
        return _Unprintable()  # type: ignore[return-value]
    return f"ran {command}"


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("this value has no text")

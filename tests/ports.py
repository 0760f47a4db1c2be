"""Free TCP ports on 127.0.0.1, none handed to two tests of a parallel run.

Asking the kernel for port 0 and closing the socket races: another xdist
worker may be given the same port before the first test binds it. Each
worker hands out ports from a block of its own, below the ephemeral range the
kernel picks client ports from, skipping any port that is taken, and never
hands out one port twice.
"""

from __future__ import annotations

import socket
import threading

from tests.lanes import lane

__all__ = ["free_port"]

FIRST = 20_000
BLOCK = 500
"""Ports per xdist worker: 20 workers fit below 30,000 (the kernel's ephemeral range
starts at 32,768)."""

_ports = iter(range(FIRST + lane() * BLOCK, FIRST + (lane() + 1) * BLOCK))
_lock = threading.Lock()


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now, and that no other test of the run
    is given: for a server the test starts, or as the address of one that is down."""
    with _lock:
        for port in _ports:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            return port
    raise RuntimeError(f"this test worker has used all {BLOCK} of its ports")

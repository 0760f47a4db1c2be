"""Which lane of a parallel run this process is, and the shared servers' parts it owns.

`make test` runs the suite on pytest-xdist workers (`gw0`, `gw1`, ...): each is
a lane with its own Redis database number, key prefixes, PostgreSQL
databases, ports (tests.ports) and RELAYQ_HOME, so no test sees another's
leftovers whatever lane or order it runs in. A run without xdist is lane 0.
"""

from __future__ import annotations

import os

__all__ = ["lane", "redis_db"]

REDIS_DATABASES = 16
"""A stock Redis server's database count."""
FIRST_REDIS_DB = int(os.environ.get("RELAYQ_TEST_REDIS_DB", "8"))
"""The first of the machine's Redis databases the tests use, one per lane after it."""


def lane() -> int:
    """This process's xdist worker number (`gw3` is 3), or 0 outside xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker.removeprefix("gw")) if worker.startswith("gw") else 0


def redis_db() -> int:
    """The machine Redis's database number of this lane.

    Lanes past the server's last database share one again; their keys stay
    apart by prefix, which every test takes anyway.
    """
    span = REDIS_DATABASES - FIRST_REDIS_DB
    return FIRST_REDIS_DB + lane() % span

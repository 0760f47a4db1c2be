"""Fixtures of the tasks' tests: a Redis of the module's own, and a key prefix per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.brokers import PrivateRedis


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateRedis]:
    """A private `redis-server` for the test module, which a test may stop."""
    with PrivateRedis(tmp_path_factory.mktemp("tasks-redis")) as server:
        yield server


@pytest.fixture
def prefix() -> str:
    return f"test-{uuid.uuid4().hex[:8]}:"

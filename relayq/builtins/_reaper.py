"""The supervisor each bash command runs under, so that nothing it starts outlives it.

The bash builtin runs this file as a script in a fresh interpreter,

    python -I -S _reaper.py COMMAND PARENT_PID   (environment: NAME=VALUE\\0... on stdin)

and it imports nothing but the standard library. On Linux it first makes itself
a child subreaper (prctl PR_SET_CHILD_SUBREAPER): every process the command
leaves behind, even one that called setsid or forked twice to become a daemon,
is re-parented to it rather than to init. When the command exits, or when the
supervisor gets SIGTERM (time is up, or the call was cancelled), it kills the
command's process group and then every child it has, again and again until
none is left, reaping each. It exits as the command did: same code, or same
signal. Should the worker die first, PR_SET_PDEATHSIG sends the supervisor
SIGTERM, and it cleans up the same way.

Without prctl (not Linux) only the command's process group is killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
# Python ignores these; a command must start with the defaults.
_RESET = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM, signal.SIGINT)
# With no /proc, children cannot be listed: stop waiting for them after this long.
_GIVE_UP_SECONDS = 5.0

_command_group = 0


def main() -> None:
    command, parent = sys.argv[1], int(sys.argv[2])
    if _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM) and os.getppid() != parent:
        return  # the worker died before the tie was made: run nothing
    env = _read_env()
    _stdin_from_devnull()
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    # Blocked until the command's pid is known, so the handler always has a target.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    signal.signal(signal.SIGTERM, _on_term)
    pid = os.posix_spawn(
        "/bin/bash",
        ["/bin/bash", "-c", command],
        env,
        setpgroup=0,
        setsigmask=(),
        setsigdef=_RESET,
    )
    global _command_group
    _command_group = pid
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    _, status = os.waitpid(pid, 0)
    _kill_all(pid)
    _exit_like(status)


def _read_env() -> dict[str, str]:
    data = sys.stdin.buffer.read().decode("utf-8", "surrogateescape")
    pairs = (item.partition("=") for item in data.split("\0") if item)
    return {name: value for name, _, value in pairs}


def _stdin_from_devnull() -> None:
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)


def _prctl(option: int, value: int) -> bool:
    """Linux's prctl(option, value); False where there is none or it fails."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _on_term(signum: int, frame: object) -> None:
    # No exception here: waitpid resumes and sees the command die like any other end.
    with contextlib.suppress(OSError):
        os.killpg(_command_group, signal.SIGKILL)


def _kill_all(group: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(group, signal.SIGKILL)
    blind_since: float | None = None
    while True:
        kids = _children()
        for kid in kids:
            with contextlib.suppress(OSError):
                os.kill(kid, signal.SIGKILL)
        try:
            pid, _ = os.waitpid(-1, 0 if kids else os.WNOHANG)
        except ChildProcessError:
            return  # no child left
        if pid == 0:
            # A child we cannot see: no /proc. Wait a little, then give up on it.
            blind_since = blind_since or time.monotonic()
            if time.monotonic() - blind_since > _GIVE_UP_SECONDS:
                return
            time.sleep(0.01)


def _children() -> list[int]:
    me = os.getpid()
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    kids: list[int] = []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == me:
            kids.append(int(name))
    return kids


def _exit_like(status: int) -> None:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        _die_of(sig)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status))


def _die_of(sig: int) -> None:
    with contextlib.suppress(OSError, ValueError):
        import resource

        # Dying of SIGSEGV must not leave a core file in the working directory.
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    with contextlib.suppress(OSError, ValueError):
        signal.signal(sig, signal.SIG_DFL)  # refused for SIGKILL, which needs none
    with contextlib.suppress(OSError, ValueError):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)


if __name__ == "__main__":
    main()

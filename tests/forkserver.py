"""Python processes for the tests, forked from an interpreter that has done its imports.

Half the suite's CPU went on processes starting: each worker and each `relayq`
command imports Celery, kombu, SQLAlchemy, pydantic and relayq's own packages
again, two seconds of a core apiece. A lane (tests.lanes) starts one fork server
at its first `spawn`: a process that imports those once and then only forks.
Each child is a process of its own, as `subprocess.Popen` would start: its own
pid and, with `start_new_session`, its own process group (SIGKILL it, kill its
group), its own environment, working directory, argv and standard streams,
closed descriptors, fresh stdio objects, non-daemon threads joined and atexit
handlers run when it ends. Only what the server imported is not imported again.

The server preloads only modules that read nothing from the environment when
they are imported (`PRELOAD`); `workers` (whose app reads its settings at import)
and the test's own agents load in the child, as in any fresh process. A command
it cannot start exactly as an interpreter would (other interpreter flags, a
`PYTHON*` variable that changes how one starts, `pass_fds`, a non-Python
program) runs through `subprocess.Popen`, as does everything where
`RELAYQ_TEST_FORKSERVER=0`.

    proc = spawn([sys.executable, "-m", "workers", "worker"], env=env, stdout=log)
    done = run([RELAYQ, "runs", "--json"], capture_output=True, text=True, timeout=30)
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import io
import json
import os
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, Protocol

__all__ = ["Proc", "run", "spawn"]

ROOT = Path(__file__).resolve().parents[1]

PRELOAD = (
    "celery",
    "celery.app.base",
    "celery.apps.worker",
    "celery.apps.beat",
    "celery.bin.base",
    "celery.bin.worker",
    "celery.bin.beat",
    "celery.worker.consumer",
    "celery.worker.control",
    "celery.concurrency.base",
    "kombu.transport.redis",
    "redis",
    "sqlalchemy",
    "sqlalchemy.dialects.sqlite",
    "sqlalchemy.dialects.postgresql",
    "psycopg",
    "sqlmodel",
    "pydantic",
    "click",
    "greenlet",
    "yaml",
    "relayq",
    "store",
    "tasks",
)
"""Imported once by the server. Each reads nothing from the environment at import."""

ENV_AT_IMPORT = ("prometheus_client",)
"""Modules that read the environment when imported (prometheus_client its multiprocess
folder): the server refuses to start if a preload drew one in, since every child would
then have the server's view instead of its own."""

STARTUP_VARIABLES = frozenset(
    {
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "PYTHONOPTIMIZE",
        "PYTHONDEBUG",
        "PYTHONINSPECT",
        "PYTHONNOUSERSITE",
        "PYTHONUSERBASE",
        "PYTHONWARNINGS",
        "PYTHONDEVMODE",
        "PYTHONFAULTHANDLER",
        "PYTHONTRACEMALLOC",
        "PYTHONPROFILEIMPORTTIME",
        "PYTHONHASHSEED",
        "PYTHONSAFEPATH",
        "PYTHONIOENCODING",
        "PYTHONUTF8",
        "PYTHONPYCACHEPREFIX",
        "PYTHONINTMAXSTRDIGITS",
    }
)
"""Variables an interpreter reads as it starts: a command whose environment differs from
the server's in one of them starts the ordinary way."""


class Proc(Protocol):
    """What the tests use of a started process: `subprocess.Popen`'s, or a forked one's."""

    args: Any
    pid: int
    returncode: int | None

    @property
    def stdin(self) -> IO[Any] | None: ...
    @property
    def stdout(self) -> IO[Any] | None: ...
    @property
    def stderr(self) -> IO[Any] | None: ...
    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...
    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]: ...


def spawn(args: Sequence[str | os.PathLike[str]], **options: Any) -> Proc:
    """`subprocess.Popen(args, **options)`, forked from the lane's server where it can be."""
    argv = [os.fspath(a) for a in args]
    plan = _plan(argv, options)
    server = None if plan is None else _server()
    env = options.get("env")
    if plan is None or server is None or (env is not None and not server.starts_like(env)):
        return subprocess.Popen(argv, **options)
    return _Forked(server.address, argv, plan, options)


def run(
    args: Sequence[str | os.PathLike[str]],
    *,
    input: Any = None,
    capture_output: bool = False,
    timeout: float | None = None,
    check: bool = False,
    **options: Any,
) -> subprocess.CompletedProcess[Any]:
    """`subprocess.run`, with the process from `spawn`."""
    if capture_output:
        options["stdout"] = options["stderr"] = subprocess.PIPE
    if input is not None:
        options["stdin"] = subprocess.PIPE
    proc = spawn(args, **options)
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    code = proc.wait()
    if check and code:
        raise subprocess.CalledProcessError(code, proc.args, out, err)
    return subprocess.CompletedProcess(proc.args, code, out, err)


# --- which commands the server starts -----------------------------------------------------


def _plan(argv: list[str], options: dict[str, Any]) -> dict[str, Any] | None:
    """How the child runs `argv` (`{"module": ...}` or `{"script": ...}`), or None for
    a command only `subprocess.Popen` starts exactly."""
    if os.environ.get("RELAYQ_TEST_FORKSERVER", "1") == "0":
        return None
    unsupported = {"pass_fds", "preexec_fn", "process_group", "user", "group", "extra_groups"}
    if unsupported & {k for k, v in options.items() if v} or options.get("shell"):
        return None
    if options.get("close_fds") is False:
        return None
    if _is_this_python(argv[0]):
        if len(argv) >= 3 and argv[1] == "-m":
            return {"module": argv[2], "argv": ["-m", *argv[3:]]}
        if len(argv) >= 3 and argv[1] == "-c":
            return {"code": argv[2], "argv": ["-c", *argv[3:]]}
        return None
    if _is_script_of_this_python(argv[0]):
        return {"script": argv[0], "argv": argv}
    return None


def _is_this_python(program: str) -> bool:
    if os.sep not in program:
        return False
    return os.path.realpath(program) == os.path.realpath(sys.executable) and (
        Path(program).parent == Path(sys.executable).parent or program == sys.executable
    )


def _is_script_of_this_python(program: str) -> bool:
    """A console script of this virtualenv (`.venv/bin/relayq`): `#!` this interpreter."""
    if os.sep not in program or not os.path.isfile(program):
        return False
    with open(program, "rb") as f:
        first = f.readline(512)
    return first.strip() == b"#!" + os.fsencode(sys.executable)


# --- the test side --------------------------------------------------------------------------


_SOCKETS = tempfile.gettempdir()
"""Where the servers' sockets go: the temp folder the process started with, whatever a
test points `tempfile` at later (a socket's path must stay under 108 bytes)."""


class _Server:
    """This lane's fork server: a process of its own, gone when the lane goes."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="relayq-forkserver-", dir=_SOCKETS)
        self.address = os.path.join(self.folder, "server.sock")
        self.startup = {k: os.environ.get(k) for k in STARTUP_VARIABLES}
        ready_r, ready_w = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.forkserver", self.address, str(ready_w)],
            cwd=ROOT, stdin=subprocess.PIPE, pass_fds=[ready_w], start_new_session=True,
        )  # fmt: skip
        os.close(ready_w)
        with os.fdopen(ready_r, "rb") as ready:
            answer = ready.read()
        if answer != b"ready":
            self.proc.wait()
            raise RuntimeError(f"the tests' fork server did not start: {answer.decode()}")
        atexit.register(self.stop)

    def starts_like(self, env: dict[str, str]) -> bool:
        """Whether an interpreter started in `env` would start as the server did."""
        return all(env.get(k) == self.startup.get(k) for k in STARTUP_VARIABLES)

    def stop(self) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            self.proc.stdin.close()  # the server ends at its stdin's end
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


_lock = threading.Lock()
_the_server: _Server | None = None


def _server() -> _Server:
    global _the_server
    with _lock:
        if _the_server is None or _the_server.proc.poll() is not None:
            _the_server = _Server()
        return _the_server


class _Forked:
    """A process the fork server started: `subprocess.Popen`'s interface, over a socket
    that carries its pid and, at its end, its exit status."""

    def __init__(
        self, address: str, argv: list[str], plan: dict[str, Any], options: dict[str, Any]
    ) -> None:
        self.args: Any = argv
        self.returncode: int | None = None
        text = bool(
            options.get("text")
            or options.get("universal_newlines")
            or options.get("encoding")
            or options.get("errors")
        )
        theirs: list[int] = []  # the child's stdin, stdout, stderr
        self.stdin: IO[Any] | None = None
        self.stdout: IO[Any] | None = None
        self.stderr: IO[Any] | None = None
        for n, name in enumerate(("stdin", "stdout", "stderr")):
            target = options.get(name)
            if target == subprocess.PIPE:
                r, w = os.pipe()
                child, own = (r, w) if n == 0 else (w, r)
                theirs.append(child)
                setattr(self, name, _wrap(own, n == 0, text, options))
            elif target == subprocess.STDOUT and n == 2:
                theirs.append(-1)  # the server dups the child's stdout
            elif target == subprocess.DEVNULL:
                theirs.append(os.open(os.devnull, os.O_RDWR))
            elif target is None:
                theirs.append(os.dup(n))
            elif isinstance(target, int):
                theirs.append(target)
            else:
                theirs.append(target.fileno())
        cwd = options.get("cwd")
        request = {
            **plan,
            "cwd": os.fspath(cwd) if cwd is not None else os.getcwd(),
            "env": dict(os.environ if options.get("env") is None else options["env"]),
            "session": bool(options.get("start_new_session")),
            "stderr_to_stdout": theirs[2] == -1,
        }
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(address)
        sent = [fd for fd in theirs if fd != -1]
        socket.send_fds(self._sock, [json.dumps(request).encode() + b"\n"], sent)
        for n, fd in enumerate(theirs):
            target = options.get(("stdin", "stdout", "stderr")[n])
            if target in (subprocess.PIPE, subprocess.DEVNULL, None):
                os.close(fd)  # the child has its copy
        self._received = b""
        first = json.loads(self._line(None) or b'{"error": "the fork server went away"}')
        if "error" in first:
            raise OSError(f"the fork server could not start {argv}: {first['error']}")
        self.pid: int = first["pid"]

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read_status(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and not self._read_status(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def _read_status(self, timeout: float | None) -> bool:
        """Take the exit status if the server sends it within `timeout` seconds."""
        line = self._line(timeout)
        if line is None:
            return False
        if not line:
            raise RuntimeError(f"the fork server went away while {self.pid} ran")
        self.returncode = int(json.loads(line)["status"])
        self._sock.close()
        return True

    def _line(self, timeout: float | None) -> bytes | None:
        """The server's next line; b"" if it closed the socket, None if none came in time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._received:
            left = None if deadline is None else max(deadline - time.monotonic(), 0)
            readable, _, _ = select.select([self._sock], [], [], left)
            if not readable:
                return None
            chunk = self._sock.recv(4096)
            if not chunk:
                return b""
            self._received += chunk
        line, self._received = self._received.split(b"\n", 1)
        return line

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]:
        outputs: dict[str, Any] = {}
        readers = [
            threading.Thread(target=lambda n=name, s=stream: outputs.__setitem__(n, s.read()))
            for name, stream in (("out", self.stdout), ("err", self.stderr))
            if stream is not None
        ]
        for t in readers:
            t.daemon = True
            t.start()
        if self.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                if input:
                    self.stdin.write(input)
                self.stdin.close()
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in readers:
            t.join(None if deadline is None else max(deadline - time.monotonic(), 0))
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        self.wait(None if deadline is None else max(deadline - time.monotonic(), 0))
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        return outputs.get("out"), outputs.get("err")

    def __enter__(self) -> _Forked:
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self.wait()


def _wrap(fd: int, writing: bool, text: bool, options: dict[str, Any]) -> IO[Any]:
    if not text:  # Popen's pipes: unbuffered to the child, buffered from it
        return open(fd, "wb" if writing else "rb", buffering=0 if writing else -1)
    return io.TextIOWrapper(
        open(fd, "wb" if writing else "rb"),
        encoding=options.get("encoding") or "utf-8",
        errors=options.get("errors") or "strict",
        write_through=writing,
    )


# --- the server side ------------------------------------------------------------------------


def _serve(address: str, ready_fd: int) -> None:
    """Preload, say ready, then fork a child for each request until stdin ends or the lane
    that started it is gone (a process the lane forked may hold stdin's other end)."""
    lane = os.getppid()
    try:
        for name in PRELOAD:
            __import__(name)
        drawn = [m for m in ENV_AT_IMPORT if m in sys.modules]
        if drawn:
            raise RuntimeError(f"preloading imported {drawn}, which read the environment")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(address)
        listener.listen(64)
    except BaseException:
        os.write(ready_fd, traceback.format_exc().encode())
        raise
    os.write(ready_fd, b"ready")
    os.close(ready_fd)
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    signal.set_wakeup_fd(wake_w.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, socket.socket] = {}
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(wake_r, selectors.EVENT_READ, "child")
    selector.register(sys.stdin, selectors.EVENT_READ, "stdin")
    while os.getppid() == lane:
        for key, _ in selector.select(timeout=1.0):
            if key.data == "stdin" and not os.read(sys.stdin.fileno(), 4096):
                return
            if key.data == "accept":
                conn, _addr = listener.accept()
                _fork(conn, children, (listener, wake_r, wake_w, selector))
            if key.data == "child":
                with contextlib.suppress(BlockingIOError):
                    wake_r.recv(4096)
        _reap(children)


def _fork(conn: socket.socket, children: dict[int, socket.socket], own: tuple[Any, ...]) -> None:
    message, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 3)
    request = json.loads(message)
    try:
        pid = os.fork()
    except OSError as exc:
        conn.sendall(json.dumps({"error": str(exc)}).encode() + b"\n")
        conn.close()
        return
    if pid == 0:
        _child(request, fds)  # never returns
    for fd in fds:
        os.close(fd)
    children[pid] = conn
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"status": os.waitstatus_to_exitcode(status)}).encode())
                conn.sendall(b"\n")
            conn.close()


def _child(request: dict[str, Any], fds: list[int]) -> None:
    """Become the process `request` asks for, run it, and exit as an interpreter would."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        if request["session"]:
            os.setsid()
        streams = [*fds]
        if request["stderr_to_stdout"]:
            streams.append(fds[1])
        for n, fd in enumerate(streams):
            os.dup2(fd, n)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
        _fresh_stdio()
        sys.argv = list(request["argv"])
        code = _run_main(request)
    except SystemExit as exc:
        code = _exit_code(exc)
    except KeyboardInterrupt:
        code = -signal.SIGINT
    except BaseException:
        traceback.print_exc()
        code = 1
    _finish(code)


def _run_main(request: dict[str, Any]) -> int:
    import runpy

    try:
        if "module" in request:
            sys.path[0] = os.getcwd()
            runpy._run_module_as_main(request["module"])  # type: ignore[attr-defined]  # what `python -m` calls
        elif "code" in request:
            sys.path[0] = ""
            main = types.ModuleType("__main__")
            main.__builtins__ = builtins  # type: ignore[attr-defined]
            sys.modules["__main__"] = main
            exec(compile(request["code"], "<string>", "exec"), main.__dict__)
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(request["script"]))
            runpy.run_path(request["script"], run_name="__main__")
    except SystemExit as exc:
        return _exit_code(exc)
    except KeyboardInterrupt:
        return -signal.SIGINT
    except BaseException:
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _fresh_stdio() -> None:
    """New stdin, stdout and stderr objects over descriptors 0-2, buffered as a new
    interpreter would buffer them for this environment and these files."""
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    for n, name in enumerate(("stdin", "stdout", "stderr")):
        tty = os.isatty(n)
        # -u leaves stdout and stderr unbuffered below the text layer, as here.
        buffering = 0 if unbuffered and n > 0 else -1
        raw = open(n, "rb" if n == 0 else "wb", buffering=buffering, closefd=False)  # noqa: SIM115
        stream = io.TextIOWrapper(
            raw,
            encoding=None,
            errors="backslashreplace" if n == 2 else "strict",
            line_buffering=n == 2 or (tty and n == 1),
            write_through=unbuffered and n > 0,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _finish(code: int) -> None:
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]  # join non-daemon threads
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    if code < 0:  # an unhandled KeyboardInterrupt: die of SIGINT, as Python does
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code & 0xFF)


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]))

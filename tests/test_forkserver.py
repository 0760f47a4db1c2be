"""The tests' fork server starts each process as the interpreter would have (tests.forkserver)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import forkserver

PY = sys.executable
ROOT = Path(__file__).resolve().parents[1]


def _forked(proc: forkserver.Proc) -> bool:
    return not isinstance(proc, subprocess.Popen)


def test_a_child_has_its_own_argv_environment_folder_and_streams(tmp_path: Path):
    code = (
        "import json, os, sys\n"
        "print(json.dumps([sys.argv, os.environ.get('ONLY_HERE'), os.getcwd(), __name__,\n"
        "    sys.path[0], os.getppid() != int(sys.argv[1])]))\n"
        "print('to stderr', file=sys.stderr)\n"
        "raise SystemExit(sys.stdin.read().strip())\n"
    )
    env = {**os.environ, "ONLY_HERE": "yes"}

    proc = forkserver.spawn(
        [PY, "-c", code, str(os.getpid())], env=env, cwd=tmp_path, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = proc.communicate("exit 7\n", timeout=30)

    assert _forked(proc)
    argv, only_here, cwd, name, path0, other_parent = json.loads(out)
    assert argv == ["-c", str(os.getpid())]
    assert (only_here, cwd, name) == ("yes", str(tmp_path), "__main__")
    assert (path0, other_parent) == ("", True)
    assert err == "to stderr\nexit 7\n"  # SystemExit's message, and exit status 1, as Python does
    assert proc.returncode == 1
    assert "ONLY_HERE" not in os.environ


def test_python_m_runs_the_module_as_main_and_reports_a_missing_one_as_python_does(
    tmp_path: Path,
):
    (tmp_path / "hello_main.py").write_text(
        "import sys\nprint(__name__, sys.argv[1:], sys.argv[0].endswith('hello_main.py'))\n"
    )

    done = forkserver.run(
        [PY, "-m", "hello_main", "a", "b"], cwd=tmp_path, capture_output=True, text=True
    )
    missing = forkserver.run([PY, "-m", "no_such_module_anywhere"], capture_output=True, text=True)

    assert (done.returncode, done.stdout) == (0, "__main__ ['a', 'b'] True\n")
    assert missing.returncode == 1
    assert missing.stderr == f"{PY}: No module named no_such_module_anywhere\n"


def test_a_new_session_is_a_process_group_a_test_can_kill_whole(tmp_path: Path):
    # Given a child in a session of its own, with a grandchild in its group
    pidfile = tmp_path / "grandchild"
    code = (
        "import subprocess, sys, time\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(g.pid))\n"
        "time.sleep(60)\n"
    )
    proc = forkserver.spawn([PY, "-c", code], start_new_session=True)
    deadline = time.monotonic() + 30
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline
        assert proc.poll() is None
        time.sleep(0.02)
    grandchild = int(pidfile.read_text())

    # When the test SIGKILLs the group
    assert os.getpgid(proc.pid) == proc.pid != os.getpgid(0)
    os.killpg(proc.pid, signal.SIGKILL)

    # Then both die, and the child's status is its signal's, as Popen reports it
    assert proc.wait(timeout=30) == -signal.SIGKILL
    deadline = time.monotonic() + 30
    while _alive(grandchild):
        assert time.monotonic() < deadline, "the grandchild outlived its group's SIGKILL"
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_wait_times_out_and_poll_does_not_block_while_the_child_runs():
    proc = forkserver.spawn([PY, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)

    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.05)
    assert proc.stdin is not None
    proc.stdin.close()  # the child reads to the end and exits 0
    assert proc.wait(timeout=30) == 0
    assert proc.poll() == 0


def test_a_child_ends_as_an_interpreter_does(tmp_path: Path):
    # Non-daemon threads are joined, then atexit handlers run, then buffered output is flushed.
    code = (
        "import atexit, sys, threading, time\n"
        "atexit.register(lambda: print('atexit ran'))\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('thread done'))).start()\n"
        "sys.stdout.write('unflushed ')\n"
    )
    done = forkserver.run([PY, "-c", code], capture_output=True, text=True, timeout=30)
    interrupted = forkserver.run([PY, "-c", "raise KeyboardInterrupt"], capture_output=True)
    crashed = forkserver.run([PY, "-c", "1/0"], capture_output=True, text=True)

    assert done.stdout == "unflushed thread done\natexit ran\n"
    assert interrupted.returncode == -signal.SIGINT
    assert crashed.returncode == 1
    assert crashed.stderr.rstrip().endswith("ZeroDivisionError: division by zero")


def test_output_to_a_file_and_stderr_to_stdout_land_in_order(tmp_path: Path):
    log = tmp_path / "log"
    code = "import sys\nprint('one')\nprint('two', file=sys.stderr)\nprint('three')\n"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as out:
        proc = forkserver.spawn([PY, "-c", code], env=env, stdout=out, stderr=subprocess.STDOUT)
    assert proc.wait(timeout=30) == 0
    assert log.read_text() == "one\ntwo\nthree\n"


def test_a_console_script_of_this_virtualenv_is_forked_too():
    relayq = Path(PY).parent / "relayq"

    proc = forkserver.spawn(
        [relayq, "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out, err = proc.communicate(timeout=60)

    assert _forked(proc)
    assert (proc.returncode, err) == (0, "")
    assert "Usage: relayq" in out


@pytest.mark.parametrize(
    ("argv", "options"),
    [
        ([PY, "-X", "importtime", "-c", "pass"], {}),  # an interpreter flag
        ([PY, "-c", "pass"], {"env": {**os.environ, "PYTHONPATH": "/nowhere"}}),
        ([PY, "-c", "pass"], {"pass_fds": [0]}),
        (["/bin/true"], {}),
    ],
    ids=["flag", "startup-variable", "pass-fds", "not-python"],
)
def test_a_command_the_server_cannot_start_exactly_runs_through_popen(argv, options):
    proc = forkserver.spawn(argv, **options)

    assert isinstance(proc, subprocess.Popen)
    assert proc.wait(timeout=60) == 0


def test_the_server_preloads_nothing_that_reads_the_environment_at_import():
    # What a child imports again reads the child's environment: relayq's own packages that
    # read settings at import (workers.app) and prometheus_client are not preloaded.
    code = "import json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    done = forkserver.run([PY, "-c", code], capture_output=True, text=True, timeout=30)
    loaded = set(json.loads(done.stdout))

    assert {"celery", "sqlalchemy", "relayq", "store", "tasks"} <= loaded
    assert not [m for m in loaded if m.split(".")[0] in ("workers", "api", "cli")]
    assert not [m for m in loaded if m.split(".")[0] in forkserver.ENV_AT_IMPORT]


def test_a_server_stopped_leaves_neither_its_process_nor_its_socket_folder():
    # Given a fork server of the test's own
    server = forkserver._Server()
    try:
        assert os.path.exists(server.address)
    finally:
        # When it is stopped
        server.stop()

    # Then its process has ended and its folder is gone
    assert server.proc.poll() is not None
    assert not os.path.exists(server.folder)

"""Stopping the processes a test started, whole process groups, without leaving any behind."""

from __future__ import annotations

import os
import signal
import subprocess

from tests.forkserver import Proc


def stop_group(proc: Proc, timeout: float = 15.0) -> None:
    """SIGTERM the process's group (started with start_new_session), SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

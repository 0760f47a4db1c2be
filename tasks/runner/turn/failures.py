"""What a worker logs of a failed turn: one line, then the frames of its user's code.

    run run_3f… of agent 'support' failed in turn 2: KeyError: 'order'
      File "/srv/app/agents.py", line 41, in lookup
        return book[args["order"]]

The line holds the run's stored error (type and a short, redacted message: never
the prompt or a key); the frames are those of the code that raised, left out
the ones of relayq's own packages, of the standard library (asyncio) and of the
installed dependencies (Celery, kombu, billiard, httpx...): where the user's
model or tool went wrong, not the twenty frames that led to it. Celery logs the
task's end in a line of its own, without its traceback (`throws` on the task).
"""

from __future__ import annotations

import os
import sysconfig
import traceback
from pathlib import Path

from relayq import RelayqError

__all__ = ["failure_report", "user_frames"]

_ROOT = Path(__file__).resolve().parents[3]
_PACKAGES = ("relayq", "store", "tasks", "workers", "api", "cli")
_OURS = tuple(str(_ROOT / name) + os.sep for name in _PACKAGES)
_LIBRARIES = tuple(
    {
        str(Path(path).resolve()) + os.sep
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if (path := sysconfig.get_paths().get(key))
    }
)


def failure_report(
    run_id: str, agent: str, turn: int, error: str, exc: BaseException | None = None
) -> str:
    """The log record of a run that failed in `turn`, saying `error` (as stored): one
    line, then the user's frames of `exc`, if any.

    An exception no frame of the user's raised, and that is no error of relayq's
    own making (a provider's refusal, a turn out of time), keeps the one frame
    where it was raised: a bug is then found without a traceback's data.
    """
    line = f"run {run_id} of agent {agent!r} failed in turn {turn}: {error}"
    if exc is None:
        return line
    frames = user_frames(exc)
    if not frames and not isinstance(exc, RelayqError | TimeoutError):
        frames = traceback.extract_tb(exc.__traceback__)[-1:]
    return "\n".join([line, *(_shown(frame) for frame in frames)])


def user_frames(exc: BaseException) -> list[traceback.FrameSummary]:
    """The frames of `exc`'s traceback in the user's own files, outermost first."""
    return [f for f in traceback.extract_tb(exc.__traceback__) if _is_users(f.filename)]


def _is_users(filename: str) -> bool:
    if filename.startswith("<"):  # <frozen importlib._bootstrap>, <string>
        return False
    path = str(Path(filename).resolve())
    return not path.startswith(_OURS) and not path.startswith(_LIBRARIES)


def _shown(frame: traceback.FrameSummary) -> str:
    text = f'  File "{frame.filename}", line {frame.lineno}, in {frame.name}'
    return f"{text}\n    {frame.line.strip()}" if frame.line else text

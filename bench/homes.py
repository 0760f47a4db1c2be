"""Where a benchmark keeps its stores and its workers' logs while it runs."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["bench_home", "mode_folders"]


@contextmanager
def bench_home(prefix: str) -> Iterator[Path]:
    """A benchmark's folder for its stores and its workers' logs: removed once it ends
    well, kept and named on stderr when it fails, for the logs to be read."""
    home = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield home
    except BaseException:
        print(f"the stores and the workers' logs are kept in {home}", file=sys.stderr)
        raise
    shutil.rmtree(home, ignore_errors=True)


def mode_folders(modes: str, home: Path) -> list[tuple[str, Path]]:
    """Each of the comma-separated `modes` (`on,off`) with a fresh folder of its own under
    `home`, to measure them side by side in one go."""
    found = []
    for mode in modes.split(","):
        (home / mode).mkdir()
        found.append((mode, home / mode))
    return found

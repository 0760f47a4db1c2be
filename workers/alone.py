"""`python -m workers.alone`: a process an asyncio worker starts to run suspect turns alone.

Started and fed by its worker (`tasks.runner.alone.AloneProcesses`), never by hand: each line on
its stdin is a turn its worker has claimed (`tasks.runner.turn.task.turn_alone`), and each line it
writes back is what came of that turn. It sends the turn's next messages itself, as the
worker would, and keeps no heartbeat: the claim is its worker's.

Its loop's watch ends it at the first stall (`RELAYQ_LOOP_STALL`), where a worker waits
for `RELAYQ_LOOP_STALL_EXIT`: it runs nothing else, so a stall is its one turn's doing,
and the worker counts its end against that turn.
"""

from __future__ import annotations

import contextlib
import logging
import sys

from tasks.runner.alone import serve
from tasks.runner.runtime import Runtime
from tasks.runner.turn.task import turn_alone
from workers.app import app, settings

OOM_SCORE_ADJ = 500
"""The kernel's OOM killer picks this process before its worker: a turn that eats memory
ends its own process, whose death is counted against it, not the worker's."""


def main() -> None:
    # Linux; elsewhere, or refused, the kernel's default.
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as adj:
        adj.write(str(OOM_SCORE_ADJ))
    logging.basicConfig(
        level=logging.INFO,
        format="[%(asctime)s: %(levelname)s/alone] %(name)s: %(message)s",
        stream=sys.stderr,
    )
    rt = Runtime.of_app(app)
    rt.app = app
    stall = settings.recovery.loop_stall.total_seconds()
    rt.loop.start_watch(stall=stall, exit_after=stall)
    serve(
        lambda job: rt.loop.run(turn_alone(rt, job)),
        retiring=lambda: rt.retiring is not None,
    )


if __name__ == "__main__":
    main()

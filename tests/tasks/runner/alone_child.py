"""A child for `tasks.runner.alone`'s tests: `python -m tests.tasks.runner.alone_child`.
Each job says what to do: echo it back (with the pid), print to stdout first, end the
process (an exit, a signal), sleep, or answer and retire."""

from __future__ import annotations

import os
import time
from typing import Any

from tasks.runner.alone import serve

retire = False


def handle(job: dict[str, Any]) -> dict[str, Any]:
    global retire
    do = job["do"]
    if do == "print":
        print("a tool's own output")  # must reach stderr, not the protocol
    elif do == "exit":
        os._exit(int(job.get("code", 1)))
    elif do == "signal":
        os.kill(os.getpid(), int(job["signal"]))
    elif do == "sleep":
        if "started" in job:  # a FIFO the test waits on: opening it tells it the job runs
            open(job["started"], "w").close()
        time.sleep(float(job["seconds"]))
    elif do == "retire":
        retire = True
    return {"pid": os.getpid(), "echo": job}


if __name__ == "__main__":
    serve(handle, retiring=lambda: retire)

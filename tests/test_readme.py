"""The README's examples run as written.

Blocks fenced as `python` are complete programs and run; `py` marks fragments
(they need a worker, or top-level await).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


def test_every_python_block_of_the_readme_runs(tmp_path):
    blocks = python_blocks()
    assert blocks, "the README shows Python examples"
    for i, block in enumerate(blocks):
        script = tmp_path / f"block{i}.py"
        script.write_text(block)
        out = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, cwd=ROOT, timeout=60
        )
        assert out.returncode == 0, f"README block {i} failed:\n{out.stderr}"


def test_the_demo_runs_the_relay_example():
    out = subprocess.run(
        [sys.executable, "-m", "examples.three_relay_calls"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "alpha-done,beta-done,gamma-done" in out.stdout

"""The README's and the docs/ pages' examples run as written, and their links lead somewhere.

Blocks fenced as `python` are complete programs and run, each page's in order; `py`
marks fragments (they need a worker, or top-level await). A relative link names a file
that exists and, with `#anchor`, a heading of that file (GitHub's slugs).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]

FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"`+[^`]*`+")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)


@dataclass
class Block:
    language: str
    line: int
    """Where its opening fence is, 1-based."""
    text: str


@dataclass
class Page:
    blocks: list[Block]
    prose: str
    """The text outside fenced blocks, for links."""
    headings: list[str]


def name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def parse(path: Path) -> Page:
    """The page's fenced blocks, its prose outside them, and its headings."""
    blocks: list[Block] = []
    prose: list[str] = []
    headings: list[str] = []
    fence: tuple[str, str, int, list[str]] | None = None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        opened = FENCE.match(line)
        if fence is None:
            if opened:
                fence = (opened.group(1), opened.group(2), number, [])
                continue
            prose.append(line)
            if heading := HEADING.match(line):
                headings.append(heading.group(1))
        elif line.strip().startswith(fence[0]) and not line.strip().strip(fence[0][0]):
            blocks.append(Block(fence[1], fence[2], "\n".join(fence[3]) + "\n"))
            fence = None
        else:
            fence[3].append(line)
    assert fence is None, f"{name(path)}: the block opened on line {fence[2]} is never closed"
    return Page(blocks, "\n".join(prose), headings)


def slugs(headings: list[str]) -> set[str]:
    """GitHub's anchors: lowercase, punctuation dropped, spaces as hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    for heading in headings:
        text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def links(path: Path) -> list[str]:
    """Every link and image target of the page's prose, code spans left out."""
    return LINK.findall(CODE_SPAN.sub("", parse(path).prose))


@pytest.mark.parametrize("path", PAGES, ids=name)
def test_every_python_block_of_a_page_runs(path, tmp_path):
    blocks = [b for b in parse(path).blocks if b.language == "python"]
    if path == README:
        assert blocks, "the README shows Python examples"
    for i, block in enumerate(blocks, 1):
        script = tmp_path / f"block{i}.py"
        script.write_text(block.text)
        out = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, cwd=ROOT, timeout=60
        )
        assert out.returncode == 0, (
            f"{name(path)}: python block {i} of {len(blocks)} (line {block.line}) failed:\n"
            f"{out.stderr}"
        )


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / target.split("#")[0]).resolve() for target in links(README)}
    missing = [name(page) for page in DOCS if page.resolve() not in linked]
    assert not missing, f"README.md links none of {missing}"


@pytest.mark.parametrize("path", PAGES, ids=name)
def test_every_relative_link_of_a_page_leads_somewhere(path):
    broken = []
    for target in links(path):
        if EXTERNAL.match(target):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{target}: no file {os.path.relpath(dest, ROOT)}")
        elif anchor and dest.suffix == ".md" and anchor not in slugs(parse(dest).headings):
            broken.append(f"{target}: no heading of {name(dest)} has the anchor #{anchor}")
    assert not broken, f"{name(path)} has broken links:\n" + "\n".join(broken)


def example(module: str) -> str:
    """What `python -m examples.<module>` printed; the test fails if it failed."""
    out = subprocess.run(
        [sys.executable, "-m", f"examples.{module}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=50,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_demo_runs_the_relay_example():
    assert "alpha-done,beta-done,gamma-done" in example("three_relay_calls")


def test_the_relay_host_example_runs_a_call_on_its_host_and_the_run_finishes():
    # a worker, the API and a `relayq host` process, each started by the example
    assert "the host said: hello from the host" in example("relay_host")

"""The apply_patch builtin: the envelope format, and all of a patch or none of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from relayq import ToolContext, ToolResult
from relayq.builtins import BuiltinsConfig, builtin_tools


def _patch(*lines: str) -> str:
    return "\n".join(["*** Begin Patch", *lines, "*** End Patch"]) + "\n"


async def _apply(base: Path, patch: str) -> ToolResult:
    (tool,) = builtin_tools(BuiltinsConfig.only("apply_patch"))
    ctx = ToolContext(run_id="run_t", call_id="c1", tool_name="apply_patch", base_dir=base)
    out = await tool.invoke({"patch": patch}, ctx)
    assert isinstance(out, ToolResult)
    return out


def _files(base: Path) -> dict[str, str]:
    return {
        p.relative_to(base).as_posix(): p.read_text()
        for p in sorted(base.rglob("*"))
        if p.is_file()
    }


# -- each operation ----------------------------------------------------------


async def test_add_file_creates_it_with_parent_folders(tmp_path: Path) -> None:
    out = await _apply(tmp_path, _patch("*** Add File: pkg/new.py", "+def f():", "+    return 1"))

    assert out == ToolResult(output="Applied patch:\nA pkg/new.py")
    assert (tmp_path / "pkg/new.py").read_text() == "def f():\n    return 1\n"


async def test_update_file_replaces_lines_found_by_their_context(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text("import os\n\ndef main():\n    print('hi')\n    return 0\n")
    patch = _patch(
        "*** Update File: app.py",
        "@@ def main():",
        "-    print('hi')",
        "+    print('hello')",
        "     return 0",
    )

    out = await _apply(tmp_path, patch)

    assert out == ToolResult(output="Applied patch:\nM app.py")
    assert (tmp_path / "app.py").read_text() == (
        "import os\n\ndef main():\n    print('hello')\n    return 0\n"
    )


async def test_several_hunks_apply_in_order(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("one\ntwo\nthree\nfour\nfive\n")
    patch = _patch(
        "*** Update File: a.txt",
        "@@",
        " one",
        "-two",
        "+TWO",
        "@@",
        " four",
        "-five",
        "+FIVE",
    )

    await _apply(tmp_path, patch)

    assert (tmp_path / "a.txt").read_text() == "one\nTWO\nthree\nfour\nFIVE\n"


async def test_the_at_at_line_picks_which_occurrence_changes(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("def a():\n    x = 1\n\ndef b():\n    x = 1\n")
    patch = _patch("*** Update File: a.py", "@@ def b():", "-    x = 1", "+    x = 2")

    await _apply(tmp_path, patch)

    assert (tmp_path / "a.py").read_text() == "def a():\n    x = 1\n\ndef b():\n    x = 2\n"


async def test_end_of_file_anchors_the_hunk_at_the_end(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("x\ny\nx\n")
    patch = _patch("*** Update File: a.txt", "@@", "-x", "+z", "*** End of File")

    await _apply(tmp_path, patch)

    assert (tmp_path / "a.txt").read_text() == "x\ny\nz\n"


async def test_a_hunk_that_only_adds_goes_after_its_at_at_line(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("class A:\n    pass\n")
    patch = _patch("*** Update File: a.py", "@@ class A:", "+    x = 1")

    await _apply(tmp_path, patch)

    assert (tmp_path / "a.py").read_text() == "class A:\n    x = 1\n    pass\n"


async def test_the_first_hunk_may_leave_out_its_at_at_line(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a\nb\n")

    await _apply(tmp_path, _patch("*** Update File: a.txt", " a", "-b", "+c"))

    assert (tmp_path / "a.txt").read_text() == "a\nc\n"


async def test_unified_diff_hunk_headers_are_accepted(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a\nb\n")

    await _apply(tmp_path, _patch("*** Update File: a.txt", "@@ -1,2 +1,2 @@", " a", "-b", "+c"))

    assert (tmp_path / "a.txt").read_text() == "a\nc\n"


async def test_trailing_whitespace_differences_still_match(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("keep   \nold\n")

    await _apply(tmp_path, _patch("*** Update File: a.txt", "@@", " keep", "-old", "+new"))

    assert (tmp_path / "a.txt").read_text() == "keep   \nnew\n"


async def test_crlf_line_endings_are_kept(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"a\r\nb\r\n")

    await _apply(tmp_path, _patch("*** Update File: a.txt", "@@", " a", "-b", "+c"))

    assert (tmp_path / "a.txt").read_bytes() == b"a\r\nc\r\n"


async def test_a_missing_final_newline_stays_missing(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a\nb")

    await _apply(tmp_path, _patch("*** Update File: a.txt", "@@", "-b", "+c"))

    assert (tmp_path / "a.txt").read_text() == "a\nc"


async def test_delete_file_removes_it(tmp_path: Path) -> None:
    (tmp_path / "old.txt").write_text("bye\n")

    out = await _apply(tmp_path, _patch("*** Delete File: old.txt"))

    assert out == ToolResult(output="Applied patch:\nD old.txt")
    assert not (tmp_path / "old.txt").exists()


async def test_move_to_renames_and_updates_the_file(tmp_path: Path) -> None:
    (tmp_path / "old.py").write_text("x = 1\n")
    patch = _patch("*** Update File: old.py", "*** Move to: pkg/new.py", "@@", "-x = 1", "+x = 2")

    out = await _apply(tmp_path, patch)

    assert out == ToolResult(output="Applied patch:\nR old.py -> pkg/new.py")
    assert _files(tmp_path) == {"pkg/new.py": "x = 2\n"}


async def test_move_to_without_hunks_only_renames(tmp_path: Path) -> None:
    (tmp_path / "old.py").write_text("x = 1\n")

    await _apply(tmp_path, _patch("*** Update File: old.py", "*** Move to: new.py"))

    assert _files(tmp_path) == {"new.py": "x = 1\n"}


async def test_one_patch_reports_every_file_it_touched(tmp_path: Path) -> None:
    (tmp_path / "m.txt").write_text("a\n")
    (tmp_path / "d.txt").write_text("d\n")
    (tmp_path / "r.txt").write_text("r\n")
    patch = _patch(
        "*** Add File: a.txt",
        "+new",
        "*** Update File: m.txt",
        "@@",
        "-a",
        "+b",
        "*** Delete File: d.txt",
        "*** Update File: r.txt",
        "*** Move to: moved.txt",
    )

    out = await _apply(tmp_path, patch)

    assert out.output == "Applied patch:\nA a.txt\nM m.txt\nD d.txt\nR r.txt -> moved.txt"
    assert _files(tmp_path) == {"a.txt": "new\n", "m.txt": "b\n", "moved.txt": "r\n"}


# -- all or nothing ----------------------------------------------------------


async def test_a_failing_second_file_leaves_the_first_untouched(tmp_path: Path) -> None:
    (tmp_path / "first.txt").write_text("a\nb\n")
    (tmp_path / "second.txt").write_text("x\ny\n")
    patch = _patch(
        "*** Update File: first.txt",
        "@@",
        "-a",
        "+A",
        "*** Add File: brand_new.txt",
        "+new",
        "*** Update File: second.txt",
        "@@",
        "-y",
        "+Y",
        "@@",
        "-not in the file",
        "+whatever",
    )

    out = await _apply(tmp_path, patch)

    assert out.is_error
    assert "Update File second.txt: hunk 2" in out.output
    assert "not in the file" in out.output
    assert "nothing was changed" in out.output
    assert _files(tmp_path) == {"first.txt": "a\nb\n", "second.txt": "x\ny\n"}


async def test_adding_a_file_that_exists_changes_nothing(tmp_path: Path) -> None:
    (tmp_path / "exists.txt").write_text("keep\n")
    patch = _patch("*** Add File: other.txt", "+x", "*** Add File: exists.txt", "+clobber")

    out = await _apply(tmp_path, patch)

    assert out.is_error
    assert "Add File exists.txt: the file already exists" in out.output
    assert _files(tmp_path) == {"exists.txt": "keep\n"}


@pytest.mark.parametrize(
    ("op", "expected"),
    [
        (["*** Update File: ghost.txt", "@@", "-a", "+b"], "Update File ghost.txt: no such file"),
        (["*** Delete File: ghost.txt"], "Delete File ghost.txt: no such file"),
    ],
)
async def test_updating_or_deleting_a_missing_file_changes_nothing(
    tmp_path: Path, op: list[str], expected: str
) -> None:
    (tmp_path / "a.txt").write_text("a\n")

    out = await _apply(tmp_path, _patch("*** Delete File: a.txt", *op))

    assert out.is_error
    assert expected in out.output
    assert _files(tmp_path) == {"a.txt": "a\n"}


async def test_moving_onto_an_existing_file_changes_nothing(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a\n")
    (tmp_path / "b.txt").write_text("b\n")

    out = await _apply(tmp_path, _patch("*** Update File: a.txt", "*** Move to: b.txt"))

    assert out.is_error
    assert "already exists" in out.output
    assert _files(tmp_path) == {"a.txt": "a\n", "b.txt": "b\n"}


async def test_a_write_failing_midway_restores_what_was_written(tmp_path: Path) -> None:
    # `a.txt/b.txt` passes every check but cannot be written, since a.txt is a
    # file: by then a.txt and new_dir/x.txt have been written and must be undone.
    (tmp_path / "a.txt").write_text("original\n")
    patch = _patch(
        "*** Update File: a.txt",
        "@@",
        "-original",
        "+changed",
        "*** Add File: new_dir/x.txt",
        "+x",
        "*** Add File: a.txt/b.txt",
        "+b",
    )

    out = await _apply(tmp_path, patch)

    assert out.is_error
    assert "could not write a.txt/b.txt" in out.output
    assert "restored" in out.output
    assert _files(tmp_path) == {"a.txt": "original\n"}
    assert not (tmp_path / "new_dir").exists()


async def test_the_same_file_can_be_deleted_then_added_again(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("old\n")

    out = await _apply(tmp_path, _patch("*** Delete File: a.txt", "*** Add File: a.txt", "+new"))

    assert not out.is_error
    assert _files(tmp_path) == {"a.txt": "new\n"}


# -- malformed patches -------------------------------------------------------


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        ("*** Add File: a.txt\n+x\n*** End Patch", "must start with '*** Begin Patch'"),
        ("*** Begin Patch\n*** Add File: a.txt\n+x\n", "must end with '*** End Patch'"),
        (_patch(), "no file operations"),
        (_patch("*** Frobnicate: a.txt"), "patch line 2: expected '*** Add File: '"),
        (_patch("*** Add File: a.txt", "no plus"), "must start with '+'"),
        (_patch("*** Update File: a.txt", "@@", "?odd"), "must start with ' ', '-' or '+'"),
        (_patch("*** Update File: a.txt"), "no hunks"),
        (_patch("*** Update File: a.txt", "@@", "@@", "-a"), "hunk 1 has no lines"),
        (_patch("*** Add File: "), "needs a path"),
    ],
)
async def test_a_malformed_patch_is_an_error_that_says_where(
    tmp_path: Path, patch: str, expected: str
) -> None:
    (tmp_path / "a.txt").write_text("a\n")

    out = await _apply(tmp_path, patch)

    assert out.is_error
    assert expected in out.output
    assert _files(tmp_path) == {"a.txt": "a\n"}


async def test_a_non_utf8_file_cannot_be_updated(tmp_path: Path) -> None:
    (tmp_path / "bin.dat").write_bytes(b"\xff\xfe\n")

    out = await _apply(tmp_path, _patch("*** Update File: bin.dat", "@@", "-x", "+y"))

    assert out.is_error
    assert "not UTF-8" in out.output
    assert (tmp_path / "bin.dat").read_bytes() == b"\xff\xfe\n"

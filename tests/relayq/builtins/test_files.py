"""The read, write and edit builtins."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from relayq import ToolResult
from relayq.builtins import BuiltinsConfig

from .calls import call as _call


def _lines(n: int) -> str:
    return "".join(f"line {i}\n" for i in range(1, n + 1))


# -- read --------------------------------------------------------------------


async def test_read_prefixes_each_line_with_its_number(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("alpha\nbeta\n")

    out = await _call(tmp_path, "read", {"path": "a.txt"})

    assert out == ToolResult(output="     1\talpha\n     2\tbeta")


async def test_read_shows_the_window_and_says_the_file_goes_on(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text(_lines(10))

    out = await _call(tmp_path, "read", {"path": "a.txt", "offset": 3, "limit": 2})

    assert out.output.splitlines()[:2] == ["     3\tline 3", "     4\tline 4"]
    assert "showing lines 3-4 of 10" in out.output
    assert "offset=5" in out.output


async def test_read_says_nothing_more_when_the_window_reaches_the_end(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text(_lines(5))

    out = await _call(tmp_path, "read", {"path": "a.txt", "offset": 4})

    assert out.output == "     4\tline 4\n     5\tline 5"


async def test_read_shows_2000_lines_by_default(tmp_path: Path) -> None:
    (tmp_path / "big.txt").write_text(_lines(2500))

    out = await _call(tmp_path, "read", {"path": "big.txt"})

    assert "  2000\tline 2000" in out.output
    assert "line 2001" not in out.output
    assert "offset=2001" in out.output


async def test_read_of_an_empty_file_says_it_is_empty(tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_text("")

    out = await _call(tmp_path, "read", {"path": "empty.txt"})

    assert not out.is_error
    assert "empty" in out.output


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"path": "missing.txt"}, "file not found: missing.txt"),
        ({"path": "folder"}, "folder is a directory"),
        ({"path": "latin1.txt"}, "latin1.txt is not UTF-8"),
        ({"path": "a.txt", "offset": 4}, "offset 4 is past the end of a.txt"),
        ({"path": "a.txt", "offset": 0}, "'offset' must be at least 1"),
        ({"path": "a.txt", "limit": 0}, "'limit' must be at least 1"),
        ({"path": "a.txt", "limit": "ten"}, "'limit' must be an integer"),
    ],
)
async def test_read_errors_say_what_is_wrong(
    tmp_path: Path, args: dict[str, Any], expected: str
) -> None:
    (tmp_path / "folder").mkdir()
    (tmp_path / "latin1.txt").write_bytes("café\n".encode("latin-1"))
    (tmp_path / "a.txt").write_text(_lines(3))

    out = await _call(tmp_path, "read", args)

    assert out.is_error
    assert expected in out.output


async def test_read_cuts_long_output_with_a_note(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text(_lines(100))
    config = BuiltinsConfig(enabled=frozenset({"read"}), max_output_chars=50)

    out = await _call(tmp_path, "read", {"path": "a.txt"}, config)

    assert out.output.startswith("     1\tline 1\n")
    assert "[output cut:" in out.output
    assert "characters not shown]" in out.output


# -- write -------------------------------------------------------------------


async def test_write_creates_parent_folders_and_reports_the_size(tmp_path: Path) -> None:
    out = await _call(tmp_path, "write", {"path": "deep/er/note.txt", "content": "héllo\n"})

    assert out == ToolResult(output="Wrote 7 bytes to deep/er/note.txt")
    assert (tmp_path / "deep/er/note.txt").read_text(encoding="utf-8") == "héllo\n"


async def test_write_overwrites_an_existing_file(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("old content that is longer")

    out = await _call(tmp_path, "write", {"path": "a.txt", "content": "new"})

    assert not out.is_error
    assert (tmp_path / "a.txt").read_text() == "new"


async def test_write_accepts_an_absolute_path_inside_the_base(tmp_path: Path) -> None:
    out = await _call(tmp_path, "write", {"path": str(tmp_path / "abs.txt"), "content": ""})

    assert out == ToolResult(output="Wrote 0 bytes to abs.txt")
    assert (tmp_path / "abs.txt").read_text() == ""


async def test_write_onto_a_directory_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "folder").mkdir()

    out = await _call(tmp_path, "write", {"path": "folder", "content": "x"})

    assert out.is_error
    assert "directory" in out.output


async def test_write_under_a_file_is_an_error_not_an_exception(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("x")

    out = await _call(tmp_path, "write", {"path": "a.txt/b.txt", "content": "x"})

    assert out.is_error
    assert (tmp_path / "a.txt").read_text() == "x"


# -- edit --------------------------------------------------------------------


async def test_edit_replaces_a_unique_string(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\ny = 2\n")

    out = await _call(
        tmp_path, "edit", {"path": "a.py", "old_string": "y = 2", "new_string": "y = 3"}
    )

    assert out == ToolResult(output="Made 1 replacement in a.py")
    assert (tmp_path / "a.py").read_text() == "x = 1\ny = 3\n"


async def test_edit_of_a_repeated_string_needs_replace_all(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\nx = 1\nx = 1\n")

    out = await _call(tmp_path, "edit", {"path": "a.py", "old_string": "x = 1", "new_string": "z"})

    assert out.is_error
    assert "occurs 3 times" in out.output
    assert "replace_all" in out.output
    assert "context" in out.output
    assert (tmp_path / "a.py").read_text() == "x = 1\nx = 1\nx = 1\n"


async def test_edit_with_replace_all_replaces_every_occurrence(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\nx = 1\nx = 1\n")
    args = {"path": "a.py", "old_string": "x = 1", "new_string": "z", "replace_all": True}

    out = await _call(tmp_path, "edit", args)

    assert out == ToolResult(output="Made 3 replacements in a.py")
    assert (tmp_path / "a.py").read_text() == "z\nz\nz\n"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"path": "a.py", "old_string": "nope", "new_string": "x"}, "not found in a.py"),
        ({"path": "a.py", "old_string": "x = 1", "new_string": "x = 1"}, "are the same"),
        ({"path": "a.py", "old_string": "", "new_string": "x"}, "must not be empty"),
        ({"path": "gone.py", "old_string": "a", "new_string": "b"}, "file not found"),
        ({"path": "bin.dat", "old_string": "a", "new_string": "b"}, "not UTF-8"),
        (
            {"path": "a.py", "old_string": "x", "new_string": "y", "replace_all": "yes"},
            "true or false",
        ),
    ],
)
async def test_edit_errors_say_what_is_wrong_and_change_nothing(
    tmp_path: Path, args: dict[str, Any], expected: str
) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "bin.dat").write_bytes(b"\xff\xfe\x00a")

    out = await _call(tmp_path, "edit", args)

    assert out.is_error
    assert expected in out.output
    assert (tmp_path / "a.py").read_text() == "x = 1\n"


# -- reading streams the file ------------------------------------------------

MIB = 1024 * 1024


async def test_read_counts_lines_the_same_across_chunk_boundaries(tmp_path: Path) -> None:
    # A \r\n split between two 1 MiB chunks ends one line, not two.
    (tmp_path / "a.txt").write_bytes(b"a" * (MIB - 1) + b"\r\nb\rc\nlast")

    out = await _call(tmp_path, "read", {"path": "a.txt", "offset": 2, "limit": 2})

    assert (
        out.output == "     2\tb\n     3\tc\n(showing lines 2-3 of 4; pass offset=4 to read more)"
    )


async def test_read_counts_the_lines_past_the_window(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"x\r\n" * 3000 + b"y\rz")

    out = await _call(tmp_path, "read", {"path": "a.txt", "limit": 1})

    assert out.output == "     1\tx\n(showing lines 1-1 of 3002; pass offset=2 to read more)"


async def test_read_decodes_a_character_split_between_chunks(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"a" * (MIB - 1) + "é\n".encode())

    out = await _call(tmp_path, "read", {"path": "a.txt"}, _big_output())

    assert out.output.endswith("aé")


async def test_read_names_the_offset_of_invalid_utf8_past_the_first_chunk(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"a" * (MIB + 5) + b"\xff")

    out = await _call(tmp_path, "read", {"path": "a.txt"})

    assert out.is_error
    assert f"invalid byte at offset {MIB + 5}" in out.output


async def test_a_long_line_in_the_window_is_cut_like_any_output(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("x" * 200_000 + "\n")
    config = BuiltinsConfig(enabled=frozenset({"read"}), max_output_chars=100)

    out = await _call(tmp_path, "read", {"path": "a.txt"}, config)

    assert (
        out.output
        == "     1\t" + "x" * 93 + "\n[output cut: 199907 of 200007 characters not shown]"
    )


def _big_output() -> BuiltinsConfig:
    return BuiltinsConfig(enabled=frozenset({"read"}), max_output_chars=2 * MIB)


# -- only regular files --------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("read", {"path": "pipe"}),
        ("write", {"path": "pipe", "content": "x"}),
        ("edit", {"path": "pipe", "old_string": "a", "new_string": "b"}),
    ],
)
async def test_a_fifo_is_refused_rather_than_waited_on(
    tmp_path: Path, tool: str, args: dict[str, Any]
) -> None:
    os.mkfifo(tmp_path / "pipe")

    out = await _call(tmp_path, tool, args)

    assert out.is_error
    assert "not a regular file" in out.output


async def test_a_nul_byte_in_a_path_is_an_error(tmp_path: Path) -> None:
    out = await _call(tmp_path, "read", {"path": "a\0b"})

    assert out.is_error
    assert "NUL" in out.output

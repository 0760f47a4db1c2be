"""The grep and glob builtins."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .calls import call as _call


def _tree(base: Path, files: dict[str, str | bytes]) -> None:
    for rel, content in files.items():
        path = base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


# -- grep --------------------------------------------------------------------


async def test_grep_prints_file_line_and_text_sorted_by_file_then_line(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "b.py": "needle one\nhay\nneedle two\n",
            "a/z.py": "needle deep\n",
            "a/b/c.py": "hay\nhay\nneedle deeper\n",
        },
    )

    out = await _call(tmp_path, "grep", {"pattern": r"needle \w+"})

    assert out.output == "\n".join(
        [
            "a/b/c.py:3:needle deeper",
            "a/z.py:1:needle deep",
            "b.py:1:needle one",
            "b.py:3:needle two",
        ]
    )


async def test_grep_skips_git_folders(tmp_path: Path) -> None:
    _tree(tmp_path, {".git/config": "needle\n", "sub/.git/HEAD": "needle\n", "x.txt": "needle\n"})

    out = await _call(tmp_path, "grep", {"pattern": "needle"})

    assert out.output == "x.txt:1:needle"


async def test_grep_skips_binary_and_non_utf8_files(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "bin.dat": b"needle\x00\x01",
            "latin.txt": "needle café".encode("latin-1"),
            "ok.txt": "needle\n",
        },
    )

    out = await _call(tmp_path, "grep", {"pattern": "needle"})

    assert out.output == "ok.txt:1:needle"


async def test_grep_include_filters_by_file_name(tmp_path: Path) -> None:
    _tree(tmp_path, {"a.py": "needle\n", "b.txt": "needle\n", "sub/c.py": "needle\n"})

    out = await _call(tmp_path, "grep", {"pattern": "needle", "include": "*.py"})

    assert out.output == "a.py:1:needle\nsub/c.py:1:needle"


async def test_grep_path_narrows_the_search_to_a_folder_or_a_file(tmp_path: Path) -> None:
    _tree(tmp_path, {"a.py": "needle\n", "sub/b.py": "needle\n", "sub/c.py": "needle\n"})

    folder = await _call(tmp_path, "grep", {"pattern": "needle", "path": "sub"})
    single = await _call(tmp_path, "grep", {"pattern": "needle", "path": "sub/c.py"})

    assert folder.output == "sub/b.py:1:needle\nsub/c.py:1:needle"
    assert single.output == "sub/c.py:1:needle"


async def test_grep_with_an_invalid_regex_is_an_error(tmp_path: Path) -> None:
    out = await _call(tmp_path, "grep", {"pattern": "(unclosed"})

    assert out.is_error
    assert "invalid regex" in out.output


async def test_grep_without_matches_succeeds_and_says_so(tmp_path: Path) -> None:
    _tree(tmp_path, {"a.txt": "hay\n"})

    out = await _call(tmp_path, "grep", {"pattern": "needle"})

    assert not out.is_error
    assert "No matches" in out.output


async def test_grep_stops_at_500_matches_and_says_so(tmp_path: Path) -> None:
    _tree(tmp_path, {"many.txt": "needle\n" * 600})

    out = await _call(tmp_path, "grep", {"pattern": "needle"})

    lines = out.output.splitlines()
    assert lines[499] == "many.txt:500:needle"
    assert "many.txt:501:needle" not in lines
    assert "stopped at 500 matches" in lines[-1]


async def test_grep_of_a_missing_path_is_an_error(tmp_path: Path) -> None:
    out = await _call(tmp_path, "grep", {"pattern": "x", "path": "nowhere"})

    assert out.is_error
    assert "path not found: nowhere" in out.output


# -- glob --------------------------------------------------------------------


async def test_glob_double_star_matches_at_any_depth(tmp_path: Path) -> None:
    _tree(tmp_path, {"top.py": "", "a/mid.py": "", "a/b/low.py": "", "a/b/low.txt": ""})

    out = await _call(tmp_path, "glob", {"pattern": "**/*.py"})

    assert out.output == "a/b/low.py\na/mid.py\ntop.py"


async def test_glob_single_star_stays_in_one_folder(tmp_path: Path) -> None:
    _tree(tmp_path, {"top.py": "", "a/mid.py": "", "a/other.py": ""})

    top = await _call(tmp_path, "glob", {"pattern": "*.py"})
    inner = await _call(tmp_path, "glob", {"pattern": "a/*.py"})

    assert top.output == "top.py"
    assert inner.output == "a/mid.py\na/other.py"


async def test_glob_supports_question_marks_and_character_classes(tmp_path: Path) -> None:
    _tree(tmp_path, {"f1.txt": "", "f2.txt": "", "fx.txt": "", "f10.txt": ""})

    out = await _call(tmp_path, "glob", {"pattern": "f[0-9].t?t"})

    assert out.output == "f1.txt\nf2.txt"


async def test_glob_skips_git_folders(tmp_path: Path) -> None:
    _tree(tmp_path, {".git/config": "", ".git/hooks/x.sample": "", "src/a.c": ""})

    out = await _call(tmp_path, "glob", {"pattern": "**"})

    assert out.output == "src/a.c"


async def test_glob_under_a_path_lists_paths_relative_to_the_base(tmp_path: Path) -> None:
    _tree(tmp_path, {"src/a.py": "", "src/pkg/b.py": "", "other/c.py": ""})

    out = await _call(tmp_path, "glob", {"pattern": "**/*.py", "path": "src"})

    assert out.output == "src/a.py\nsrc/pkg/b.py"


async def test_glob_without_matches_succeeds_and_says_so(tmp_path: Path) -> None:
    out = await _call(tmp_path, "glob", {"pattern": "*.rs"})

    assert not out.is_error
    assert "No files match" in out.output


async def test_glob_stops_at_1000_files_and_says_so(tmp_path: Path) -> None:
    for i in range(1005):
        (tmp_path / f"f{i:04}.txt").write_text("")

    out = await _call(tmp_path, "glob", {"pattern": "*.txt"})

    lines = out.output.splitlines()
    assert len(lines) == 1001
    assert lines[999] == "f0999.txt"
    assert "showing 1000 of 1005 files" in lines[-1]


@pytest.mark.parametrize("pattern", ["../*", "/etc/*", "a/../../*"])
async def test_glob_patterns_cannot_climb_out(tmp_path: Path, pattern: str) -> None:
    out = await _call(tmp_path, "glob", {"pattern": pattern})

    assert out.is_error
    assert "relative" in out.output


async def test_glob_of_a_file_path_is_an_error(tmp_path: Path) -> None:
    _tree(tmp_path, {"a.txt": ""})

    out = await _call(tmp_path, "glob", {"pattern": "*", "path": "a.txt"})

    assert out.is_error
    assert "not a folder" in out.output


# -- what cannot be walked is skipped, and named ------------------------------


def _loops(base: Path) -> None:
    _tree(base, {"sub/ok.txt": "needle\n", "top.txt": "needle\n"})
    os.symlink("loop_b", base / "sub" / "loop_a")
    os.symlink("loop_a", base / "sub" / "loop_b")
    os.symlink("self", base / "self")


async def test_grep_skips_symlink_loops_says_so_and_goes_on(tmp_path: Path) -> None:
    _loops(tmp_path)

    out = await _call(tmp_path, "grep", {"pattern": "needle"})

    assert not out.is_error
    assert out.output.splitlines() == [
        "sub/ok.txt:1:needle",
        "top.txt:1:needle",
        "skipped: self (symlink loop)",
        "skipped: sub/loop_a (symlink loop)",
        "skipped: sub/loop_b (symlink loop)",
    ]


async def test_glob_skips_symlink_loops_says_so_and_goes_on(tmp_path: Path) -> None:
    _loops(tmp_path)

    out = await _call(tmp_path, "glob", {"pattern": "**/*.txt"})

    assert not out.is_error
    assert out.output.splitlines() == [
        "sub/ok.txt",
        "top.txt",
        "skipped: self (symlink loop)",
        "skipped: sub/loop_a (symlink loop)",
        "skipped: sub/loop_b (symlink loop)",
    ]


async def test_a_search_without_matches_still_names_what_it_skipped(tmp_path: Path) -> None:
    _loops(tmp_path)

    out = await _call(tmp_path, "grep", {"pattern": "absent", "path": "sub"})

    assert out.output.splitlines() == [
        "No matches for 'absent'.",
        "skipped: sub/loop_a (symlink loop)",
        "skipped: sub/loop_b (symlink loop)",
    ]


async def test_searching_a_symlink_loop_itself_is_an_error_result(tmp_path: Path) -> None:
    _loops(tmp_path)

    out = await _call(tmp_path, "grep", {"pattern": "x", "path": "sub/loop_a"})

    assert out.is_error
    assert "symlink loop" in out.output


async def test_many_skipped_entries_are_summed_up(tmp_path: Path) -> None:
    for i in range(25):
        os.symlink(f"l{i:02}", tmp_path / f"l{i:02}")

    out = await _call(tmp_path, "glob", {"pattern": "*"})

    lines = out.output.splitlines()
    assert lines[0] == "No files match '*'."
    assert lines[1:21] == [f"skipped: l{i:02} (symlink loop)" for i in range(20)]
    assert lines[21:] == ["skipped: 5 more"]


async def test_grep_skips_fifos_instead_of_waiting_on_them(tmp_path: Path) -> None:
    _tree(tmp_path, {"ok.txt": "needle\n"})
    os.mkfifo(tmp_path / "pipe")

    grep = await _call(tmp_path, "grep", {"pattern": "needle"})
    direct = await _call(tmp_path, "grep", {"pattern": "needle", "path": "pipe"})

    assert grep.output == "ok.txt:1:needle"
    assert "No matches" in direct.output

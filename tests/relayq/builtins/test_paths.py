"""Every file tool stays inside the base directory, however a path tries to leave it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .calls import call as _call

SECRET = "secret\n"


@dataclass(frozen=True)
class World:
    base: Path
    outside: Path

    def snapshot(self) -> dict[str, bytes]:
        """Every file outside the base, to prove that nothing there changed."""
        return {
            str(p.relative_to(self.outside)): p.read_bytes()
            for p in sorted(self.outside.rglob("*"))
            if p.is_file()
        }


@pytest.fixture
def world(tmp_path: Path) -> World:
    base, outside = tmp_path / "base", tmp_path / "outside"
    base.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    (base / "inside.txt").write_text("inside\n")
    (base / "link_file").symlink_to(outside / "secret.txt")
    (base / "link_dir").symlink_to(outside, target_is_directory=True)
    (base / "dangling").symlink_to(outside / "not-yet.txt")
    return World(base, outside)


# Each escape as a file path and as a folder path, for the tools that take either.
ESCAPES: dict[str, tuple[str, str]] = {
    "dotdot": ("../outside/secret.txt", "../outside"),
    "absolute": ("{outside}/secret.txt", "{outside}"),
    "symlinked_file": ("link_file", "link_file"),
    "symlinked_dir": ("link_dir/secret.txt", "link_dir"),
}


def _patch(*lines: str) -> str:
    return "\n".join(["*** Begin Patch", *lines, "*** End Patch"])


def _args(tool: str, file_path: str, dir_path: str) -> dict[str, Any]:
    return {
        "read": {"path": file_path},
        "write": {"path": file_path, "content": "pwned\n"},
        "edit": {"path": file_path, "old_string": "secret", "new_string": "pwned"},
        "grep": {"pattern": "secret", "path": dir_path},
        "glob": {"pattern": "*", "path": dir_path},
        "apply_patch": {
            "patch": _patch(f"*** Update File: {file_path}", "@@", "-secret", "+pwned")
        },
    }[tool]


@pytest.mark.parametrize("escape", list(ESCAPES))
@pytest.mark.parametrize("tool", ["read", "write", "edit", "grep", "glob", "apply_patch"])
async def test_every_file_tool_refuses_paths_outside_the_base(
    world: World, tool: str, escape: str
) -> None:
    file_path, dir_path = (p.format(outside=world.outside) for p in ESCAPES[escape])
    before = world.snapshot()

    out = await _call(world.base, tool, _args(tool, file_path, dir_path))

    assert out.is_error
    assert "is outside the base directory" in out.output
    assert "secret" not in out.output.replace("secret.txt", "")
    assert world.snapshot() == before


@pytest.mark.parametrize(
    "path", ["link_dir/new.txt", "link_dir/sub/new.txt", "dangling", "../outside/new.txt"]
)
async def test_new_files_cannot_be_created_outside_the_base(world: World, path: str) -> None:
    write = await _call(world.base, "write", {"path": path, "content": "x"})
    add = await _call(world.base, "apply_patch", {"patch": _patch(f"*** Add File: {path}", "+x")})

    assert write.is_error
    assert add.is_error
    assert "outside the base directory" in write.output
    assert "outside the base directory" in add.output
    assert world.snapshot() == {"secret.txt": SECRET.encode()}


async def test_apply_patch_cannot_move_a_file_outside_the_base(world: World) -> None:
    patch = _patch("*** Update File: inside.txt", "*** Move to: ../outside/moved.txt")

    out = await _call(world.base, "apply_patch", {"patch": patch})

    assert out.is_error
    assert "outside the base directory" in out.output
    assert (world.base / "inside.txt").exists()
    assert not (world.outside / "moved.txt").exists()


async def test_apply_patch_cannot_delete_outside_the_base(world: World) -> None:
    out = await _call(world.base, "apply_patch", {"patch": _patch("*** Delete File: link_file")})

    assert out.is_error
    assert (world.outside / "secret.txt").exists()


async def test_a_home_relative_path_is_refused(world: World) -> None:
    out = await _call(world.base, "read", {"path": "~/.bashrc"})

    assert out.is_error
    assert "outside the base directory" in out.output


async def test_grep_and_glob_do_not_follow_symlinks_out_of_the_base(world: World) -> None:
    grep = await _call(world.base, "grep", {"pattern": "secret"})
    glob = await _call(world.base, "glob", {"pattern": "**"})

    assert "No matches" in grep.output
    assert glob.output == "inside.txt"


async def test_symlinks_that_stay_inside_the_base_are_followed(world: World) -> None:
    (world.base / "alias.txt").symlink_to(world.base / "inside.txt")
    (world.base / "real").mkdir()
    (world.base / "real" / "r.txt").write_text("inside\n")
    (world.base / "alias_dir").symlink_to(world.base / "real", target_is_directory=True)

    read = await _call(world.base, "read", {"path": "alias.txt"})
    through_dir = await _call(world.base, "read", {"path": "alias_dir/r.txt"})
    grep = await _call(world.base, "grep", {"pattern": "inside"})

    assert read.output == "     1\tinside"
    assert through_dir.output == "     1\tinside"
    # A symlinked file is listed where it sits; a symlinked folder is not walked twice.
    assert grep.output == "alias.txt:1:inside\ninside.txt:1:inside\nreal/r.txt:1:inside"


async def test_an_absolute_path_inside_the_base_is_allowed(world: World) -> None:
    out = await _call(world.base, "read", {"path": str(world.base / "inside.txt")})

    assert out.output == "     1\tinside"


async def test_dotdot_that_stays_inside_the_base_is_allowed(world: World) -> None:
    (world.base / "sub").mkdir()

    out = await _call(world.base, "read", {"path": "sub/../inside.txt"})

    assert out.output == "     1\tinside"


async def test_a_base_dir_reached_through_a_symlink_still_works(
    world: World, tmp_path: Path
) -> None:
    alias = tmp_path / "alias_base"
    alias.symlink_to(world.base, target_is_directory=True)

    read = await _call(alias, "read", {"path": "inside.txt"})
    escape = await _call(alias, "read", {"path": "link_file"})

    assert read.output == "     1\tinside"
    assert escape.is_error


async def test_a_symlink_loop_is_an_error_not_an_exception(world: World) -> None:
    os.symlink("loop_b", world.base / "loop_a")
    os.symlink("loop_a", world.base / "loop_b")

    out = await _call(world.base, "read", {"path": "loop_a"})

    assert out.is_error


async def test_links_are_followed_while_they_stay_inside(world: World) -> None:
    (world.base / "sub").mkdir()
    (world.base / "abs_link").symlink_to(world.base / "inside.txt")
    (world.base / "sub" / "up").symlink_to("../inside.txt")
    (world.base / "sub" / "chain").symlink_to("up")

    for path in ["abs_link", "sub/up", "sub/chain", "sub/chain/../inside.txt"]:
        out = await _call(world.base, "read", {"path": path})
        if path.endswith("inside.txt"):
            # `chain` is a file, so nothing lies under it.
            assert out.is_error
        else:
            assert out.output == "     1\tinside", path


async def test_a_link_whose_target_climbs_out_is_refused(world: World) -> None:
    (world.base / "sub").mkdir()
    (world.base / "sub" / "out").symlink_to("../../outside/secret.txt")
    (world.base / "sub" / "via").symlink_to("../link_dir")

    read = await _call(world.base, "read", {"path": "sub/out"})
    through = await _call(world.base, "read", {"path": "sub/via/secret.txt"})
    write = await _call(world.base, "write", {"path": "sub/via/new.txt", "content": "x"})

    for out in (read, through, write):
        assert out.is_error
        assert "outside the base directory" in out.output
    assert world.snapshot() == {"secret.txt": SECRET.encode()}


async def test_writing_through_an_inside_link_changes_its_target(world: World) -> None:
    (world.base / "alias.txt").symlink_to("inside.txt")

    out = await _call(world.base, "write", {"path": "alias.txt", "content": "new\n"})

    assert out.output == "Wrote 4 bytes to inside.txt"
    assert (world.base / "inside.txt").read_text() == "new\n"
    assert (world.base / "alias.txt").is_symlink()

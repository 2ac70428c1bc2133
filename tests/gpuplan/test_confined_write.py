"""gpuplan.confined_write: writes that never follow a planted link out of their folder."""

from __future__ import annotations

import pytest

from gpuplan.confined_write import (
    LinkOutsideError,
    append_text,
    atomic_file,
    atomic_write,
    make_folder,
    write_new,
)


@pytest.fixture
def outside(tmp_path):
    """A file outside the folder written to, holding text that must stay as it is."""
    target = tmp_path / "outside.txt"
    target.write_text("keep")
    (tmp_path / "out").mkdir()
    return target


def _untouched(outside) -> bool:
    return outside.read_text() == "keep" and not outside.is_symlink()


def test_atomic_write_never_uses_the_old_predictable_temporary_name(tmp_path, outside):
    out = tmp_path / "out"
    (out / ".latest.tmp").symlink_to(outside)  # the name writers used to write through
    atomic_write(out / "latest", b"step_000002\n")
    assert (out / "latest").read_bytes() == b"step_000002\n" and _untouched(outside)
    assert sorted(p.name for p in out.iterdir()) == [".latest.tmp", "latest"]


def test_a_target_linked_outside_is_refused_and_nothing_is_written(tmp_path, outside):
    out = tmp_path / "out"
    (out / "metrics.json").symlink_to(outside)
    with pytest.raises(LinkOutsideError, match="metrics.json: resolves to .*outside"):
        atomic_write(out / "metrics.json", b"{}")
    with pytest.raises(LinkOutsideError, match="outside"):
        append_text(out / "metrics.json", "{}\n")
    assert _untouched(outside) and (out / "metrics.json").is_symlink()
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json"]  # no temporary left


def test_a_folder_on_the_way_linked_outside_is_refused(tmp_path):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "checkpoint").symlink_to(elsewhere)
    with pytest.raises(LinkOutsideError, match="checkpoint/latest: resolves to"):
        atomic_write(out / "checkpoint" / "latest", b"x", root=out)
    with pytest.raises(LinkOutsideError):
        make_folder(out / "checkpoint" / "step_000001", out)
    with pytest.raises(LinkOutsideError):
        write_new(out / "checkpoint" / "shard", b"x", root=out)
    assert list(elsewhere.iterdir()) == []


def test_links_inside_the_folder_are_fine_and_replaced_not_followed(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "real").write_text("old")
    (out / "alias").symlink_to(out / "real")
    atomic_write(out / "alias", b"new")
    assert (out / "real").read_text() == "old" and not (out / "alias").is_symlink()
    assert (out / "alias").read_text() == "new"


def test_append_and_create_never_go_through_a_link(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "real").write_text("a\n")
    (out / "alias").symlink_to(out / "real")
    with pytest.raises(LinkOutsideError, match="is a symbolic link"):
        append_text(out / "alias", "b\n")
    with pytest.raises(FileExistsError):  # an existing name, link or not: never written
        write_new(out / "alias", b"b")
    append_text(out / "log", "one\n")
    append_text(out / "log", "two\n")
    assert (out / "real").read_text() == "a\n" and (out / "log").read_text() == "one\ntwo\n"


def test_an_error_inside_the_block_leaves_the_target_and_no_temporary(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "f").write_text("before")
    with pytest.raises(RuntimeError), atomic_file(out / "f") as f:
        f.write(b"half")
        raise RuntimeError("killed")
    assert (out / "f").read_text() == "before" and [p.name for p in out.iterdir()] == ["f"]

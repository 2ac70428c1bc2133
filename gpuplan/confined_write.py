"""Writes that stay inside a folder and never follow a planted link (stdlib only: autograd's
savers and dist's checkpoints, metrics, plots, exports and token folders all write this way).

A file is written to a fresh temporary name in its own folder, created exclusively
(``O_CREAT|O_EXCL|O_NOFOLLOW``: never an existing file or link), fsynced, renamed onto its
final name (a rename replaces a link itself, never its target) and the folder fsynced: all
or nothing. Before that, the target (links resolved, folders on the way included) must lie
inside `root`, else `LinkOutsideError` and nothing is written. Appends open the file with
``O_NOFOLLOW``. Folder and file are opened relative to one folder descriptor, so a folder
swapped for a link between the check and the write is not followed either.
"""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


class LinkOutsideError(ValueError):
    """A write whose target, or a folder on its way, is a link leading out of its root."""


def check_inside(path: str | os.PathLike, root: str | os.PathLike) -> Path:
    """`path` with links resolved; LinkOutsideError when that lies outside `root` (its links
    resolved too): the target or a folder on the way is a link out of `root`."""
    path, root = Path(path), Path(root)
    resolved, base = path.resolve(), root.resolve()
    if not resolved.is_relative_to(base):
        raise LinkOutsideError(f"{path}: resolves to {resolved}, outside {root} (a link out "
                               f"of the folder); refused, nothing written")
    return resolved


def make_folder(path: str | os.PathLike, root: str | os.PathLike) -> Path:
    """Create the folder `path` (and its parents) inside `root`; refuses links out of it."""
    check_inside(path, root)
    Path(path).mkdir(parents=True, exist_ok=True)
    return check_inside(path, root)  # (a link planted while creating it)


@contextlib.contextmanager
def _folder_fd(path: Path, root: str | os.PathLike) -> Iterator[int]:
    check_inside(path, root)
    fd = os.open(path.parent.resolve(), os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def _refused(path: Path, exc: OSError) -> OSError | LinkOutsideError:
    """ELOOP from O_NOFOLLOW is a planted link: say so in one line."""
    if exc.errno == errno.ELOOP:
        return LinkOutsideError(f"{path}: is a symbolic link; refused (never written "
                                f"through a link), nothing written")
    return exc


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, root: str | os.PathLike | None = None
                ) -> Iterator[IO[bytes]]:
    """A binary file (read/write) that becomes `path` when the block ends without error;
    on error the temporary file is removed and `path` is untouched. `root` (default: the
    folder of `path`): the folder the write must stay inside."""
    path = Path(path)
    with _folder_fd(path, path.parent if root is None else root) as folder:
        tmp = f".{path.name}.{uuid.uuid4().hex[:12]}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o666,
                     dir_fd=folder)
        try:
            with os.fdopen(fd, "w+b") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path.name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=folder)
            raise
        os.fsync(folder)


def atomic_write(path: str | os.PathLike, payload: bytes,
                 root: str | os.PathLike | None = None) -> None:
    """Write `payload` to `path` all or nothing (see `atomic_file`)."""
    with atomic_file(path, root) as f:
        f.write(payload)


def write_new(path: str | os.PathLike, payload: bytes,
              root: str | os.PathLike | None = None) -> None:
    """Create `path` (it must not exist, nor be a link), write `payload` and fsync it; the
    caller fsyncs the folder."""
    path = Path(path)
    with _folder_fd(path, path.parent if root is None else root) as folder:
        try:
            fd = os.open(path.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW
                         | _CLOEXEC, 0o666, dir_fd=folder)
        except OSError as exc:
            raise _refused(path, exc) from None
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())


def append_text(path: str | os.PathLike, text: str,
                root: str | os.PathLike | None = None) -> None:
    """Append `text` to `path` (created if absent, never through a link) and fsync it."""
    path = Path(path)
    with _folder_fd(path, path.parent if root is None else root) as folder:
        try:
            fd = os.open(path.name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW
                         | _CLOEXEC, 0o666, dir_fd=folder)
        except OSError as exc:
            raise _refused(path, exc) from None
        with os.fdopen(fd, "ab") as f:
            f.write(text.encode())
            f.flush()
            os.fsync(f.fileno())


__all__ = ["LinkOutsideError", "append_text", "atomic_file", "atomic_write", "check_inside",
           "make_folder", "write_new"]

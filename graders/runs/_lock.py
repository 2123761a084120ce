"""One writer per output: an exclusive lock beside the output, and an output that is never the input.

Two runs writing one output at once interleave rows and tear lines; an output that is a hard
link (or symlink) to the input truncates the input when it is opened for writing. Both are
refused before the output is touched or any request is sent.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from ._io import InputError, RunInput, file_format


class OutputLocked(InputError):
    """Another process holds the output's lock; the message names its pid."""


def lock_path(destination: Path) -> Path:
    return destination.with_name(destination.name + ".lock")


def check_not_input(source: RunInput, destination: Path) -> None:
    """Refuse an output that is the input, by path or by inode (a hard link, a symlink).

    For a folder input, refuse an output that is one of its files. An output inside the folder
    that does not exist yet, or that an earlier run wrote (its checkpoint beside it), is fine:
    the folder's reader skips gradekit's outputs (see :func:`input_files`).
    """
    if source.is_folder:
        _check_not_in_folder(source, destination)
        return
    path = source.source
    try:
        same = destination.resolve() == path.resolve() or (destination.exists() and os.path.samefile(path, destination))
    except OSError:
        return  # the input's own absence is reported by the reader, with its name
    if same:
        raise InputError(f"{destination} is the same file as the input {path}; writing it would destroy the input. "
                         "Choose another output path")


def _check_not_in_folder(source: RunInput, destination: Path) -> None:
    from ._io import FORMATS, _is_output

    folder = source.source
    try:
        inside = destination.resolve().is_relative_to(folder.resolve())
    except OSError:
        return
    if destination.is_dir():
        raise InputError(f"{destination} is a folder; the output is one .csv, .jsonl or .parquet file")
    if (inside and destination.exists() and destination.suffix.lower() in FORMATS and not _is_output(destination)
            and not any(part.startswith((".", "_")) for part in destination.resolve().relative_to(folder.resolve()).parts)):
        raise InputError(f"{destination} is one of the input folder's files; writing it would destroy that input. "
                         "Choose another output path (a new file in the folder is fine: gradekit skips its own outputs)")
    if destination.exists():  # a hard link or symlink elsewhere to one of the folder's files
        for file in source.files:
            if os.path.samefile(file, destination):
                raise InputError(f"{destination} is the same file as the input {file}; writing it would destroy the input. "
                                 "Choose another output path")


@contextlib.contextmanager
def output_lock(source: RunInput | Path, destination: Path) -> Iterator[None]:
    """Hold ``<output>.lock`` (``fcntl.flock``, the pid inside) while a run writes ``destination``.

    The kernel drops a flock when its process dies, so a SIGKILLed run never leaves a stale lock;
    a second run fails at once (no waiting) naming the pid that holds it. Raises InputError for
    an output that is the input or a folder that cannot be written (exit 2 in the CLI). A run
    passes its resolved input; a caller holding only a path (a test, a script) has it resolved here.
    """
    check_not_input(RunInput.resolve(source), destination)
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"cannot write {destination}: cannot create its folder ({e.strerror})") from e
    # The resolved file, not the name: a symlink to the output takes the same lock file, and the
    # output's own inode is locked too, so a hard link (another name, same device and inode) is refused.
    resolved = destination.resolve()
    path = lock_path(resolved)
    fd = _acquire(path, destination)
    created = not resolved.exists()
    try:
        inode = _lock_inode(resolved, destination, create=file_format(resolved) != "parquet")
    except BaseException:
        _release(path, fd)
        raise
    try:
        yield
    finally:
        if inode is not None:
            os.close(inode)
        if created and not resolved.with_name(resolved.name + ".checkpoint.json").exists():
            with contextlib.suppress(OSError):
                if resolved.stat().st_size == 0:
                    resolved.unlink()  # created only to be locked, and the run stopped before writing it
        _release(path, fd)


def _release(path: Path, fd: int) -> None:
    # Unlink while still holding it: a run that opened the old file sees an inode that is gone and retries.
    with contextlib.suppress(OSError):
        path.unlink()
    os.close(fd)


def _lock_inode(resolved: Path, destination: Path, *, create: bool) -> int | None:
    """flock the output file itself (created empty for CSV/JSONL, which the writer opens in place anyway).

    A Parquet output is joined into place when its run ends, so until then only its name is locked.
    """
    try:
        fd = os.open(resolved, os.O_RDONLY | os.O_CLOEXEC | (os.O_CREAT if create else 0), 0o644)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise InputError(f"cannot write {destination}: {e.strerror}") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise OutputLocked(f"{destination} is being written by another run under another name (a hard link to the same file, "
                           f"device {os.stat(resolved).st_dev} inode {os.stat(resolved).st_ino}); wait for it to end, "
                           "or stop it, then run this command again") from None
    return fd


def _acquire(path: Path, destination: Path) -> int:
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise InputError(f"cannot write {destination}: {e.strerror} in {path.parent} "
                             "(the output's folder must be writable: it holds the output, its lock and checkpoint)") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise OutputLocked(f"{destination} is being written by another run (pid {holder}); wait for it to end, "
                               f"or stop it, then run this command again") from None
        try:
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = None
        if current != os.fstat(fd).st_ino:  # the holder released and unlinked it between our open and flock
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return fd


def _read_pid(fd: int) -> str:
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return text if text.isdigit() else "unknown"

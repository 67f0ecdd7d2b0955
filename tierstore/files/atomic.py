"""Atomic file output: the one way tierstore writes a file a reader may see.

The bytes go to a temp file in the target's own directory (so the rename stays on one
filesystem), are fsynced, renamed over the target, and the directory is fsynced so the
rename itself survives a crash. Any failure, an interrupt included (KeyboardInterrupt,
SystemExit), closes and removes the temp file and leaves the target as it was: a reader
sees the old file or the new one, never part of one. OSErrors become ``TierIOError``
naming the target.
"""
from __future__ import annotations

import asyncio
import contextlib
import errno
import glob
import os
import secrets
from typing import BinaryIO, Callable, Iterator

from tierstore.errors import TierIOError

TEMP_MARK = ".tmp-"   # temp names are ".<name>.tmp-<pid>-<random>" beside the target


def temp_path_for(path: str | os.PathLike) -> str:
    """A fresh temp name in the same directory as ``path`` (hidden, unique per call)."""
    head, tail = os.path.split(os.path.abspath(os.fspath(path)))
    return os.path.join(head, f".{tail}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")


def stale_temps(path: str | os.PathLike) -> list[str]:
    """Temp files a killed writer of ``path`` left beside it. Only the holder of the
    target's lock may remove them (another live writer may own one)."""
    head, tail = os.path.split(os.path.abspath(os.fspath(path)))
    return glob.glob(os.path.join(glob.escape(head), f".{glob.escape(tail)}{TEMP_MARK}*"))


def fsync_dir(directory: str | os.PathLike) -> None:
    """fsync a directory so a rename in it is durable. Filesystems that refuse fsync on a
    directory (EINVAL) still renamed atomically; only durability is weaker, so go on."""
    try:
        fd = os.open(os.fspath(directory) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _io_error(path: str, exc: OSError, offset: int = 0) -> TierIOError:
    return TierIOError(path, offset, exc.errno or errno.EIO, what="write")


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, *, mode: int = 0o644) -> Iterator[BinaryIO]:
    """``with atomic_output(p) as f: f.write(...)``: ``p`` appears, complete, when the
    block ends; nothing of it appears if the block raises. ``f`` is a binary file. A
    failed write is a TierIOError whose offset is how far the file got."""
    path = os.fspath(path)
    tmp = temp_path_for(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    except OSError as exc:
        raise _io_error(path, exc) from exc
    f = os.fdopen(fd, "wb")
    done = False
    try:
        yield f
        f.flush()
        os.fsync(fd)
        f.close()
        os.replace(tmp, path)
        done = True
    except OSError as exc:
        raise _io_error(path, exc, _position(fd)) from exc
    finally:
        if not done:
            try:
                f.close()
            except OSError:
                pass  # the flush of a failed write fails again; the file is going anyway
            remove_quietly(tmp)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def _position(fd: int) -> int:
    try:
        return os.lseek(fd, 0, os.SEEK_CUR)
    except OSError:
        return 0


def write_atomic(path: str | os.PathLike, data: bytes | memoryview) -> None:
    """Replace ``path`` with ``data`` atomically. Raises TierIOError on failure."""
    with atomic_output(path) as f:
        f.write(data)


def write_atomic_with(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> None:
    """Replace ``path`` with whatever ``write(f)`` writes into the binary file ``f``
    (``np.save``, ``fig.savefig``, ``json.dump`` of encoded text ...)."""
    with atomic_output(path) as f:
        write(f)


async def write_atomic_async(path: str | os.PathLike, data: bytes) -> None:
    """``write_atomic`` for an event loop: the write goes through aiofiles, the fsyncs and
    the rename run in the default executor, so the loop never blocks on the disk."""
    import aiofiles
    import aiofiles.os

    path = os.fspath(path)
    tmp = temp_path_for(path)
    loop = asyncio.get_running_loop()
    done = False
    try:
        async with aiofiles.open(tmp, "xb") as f:
            await f.write(data)
            await f.flush()
            await loop.run_in_executor(None, os.fsync, f.fileno())
        await aiofiles.os.replace(tmp, path)
        done = True
    except OSError as exc:
        raise _io_error(path, exc) from exc
    finally:
        if not done:
            remove_quietly(tmp)
    await loop.run_in_executor(None, fsync_dir, os.path.dirname(os.path.abspath(path)))


def create_sized_atomic(path: str | os.PathLike, size: int) -> int:
    """Create ``path`` as a sparse file of ``size`` bytes, atomically, and return an
    O_RDWR descriptor on it (the caller owns it). Used for pack files, whose rows are
    then written in place with pwrite + fdatasync."""
    path = os.fspath(path)
    tmp = temp_path_for(path)
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise _io_error(path, exc) from exc
    done = False
    try:
        os.ftruncate(fd, size)   # sparse: unwritten rows stay holes
        os.fsync(fd)
        os.rename(tmp, path)
        done = True
    except OSError as exc:
        raise _io_error(path, exc) from exc
    finally:
        if not done:
            os.close(fd)
            remove_quietly(tmp)
    fsync_dir(os.path.dirname(os.path.abspath(path)))
    return fd

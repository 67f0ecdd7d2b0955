"""Atomic writes for warm-start files: temp file + fsync + rename + dir fsync.

A reader never sees a half-written file: the bytes go to a temp file in the
same directory (so the rename stays on one filesystem), are fsynced, renamed
over the target, and the directory is fsynced so the rename itself survives a
crash. A failure removes the temp file and raises ``TierIOError`` naming the
target path.
"""
from __future__ import annotations

import asyncio
import errno
import os
import secrets

from tierstore.errors import TierIOError

MAX_WARM_FILE_BYTES = 64 << 20  # a DS4 poolmon is ~0.5 MB; anything near this is hostile


def _temp_path(path: str) -> str:
    head, tail = os.path.split(os.path.abspath(path))
    return os.path.join(head, f".{tail}.tmp.{os.getpid()}.{secrets.token_hex(4)}")


def _fsync_dir(path: str) -> None:
    # Some filesystems refuse fsync on a directory (EINVAL); the rename is
    # still atomic there, only its durability is weaker, so carry on.
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically. Raises TierIOError on failure."""
    path = os.fspath(path)
    tmp = _temp_path(path)
    written = 0
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while written < len(view):
                written += os.write(fd, view[written:])
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        _remove_quietly(tmp)
        raise TierIOError(path, written, exc.errno or errno.EIO, what="write") from exc
    _fsync_dir(path)


async def write_atomic_async(path: str | os.PathLike, data: bytes) -> None:
    """``write_atomic`` for an event loop: the write goes through aiofiles, the
    fsyncs and the rename run in the default executor, so the loop never blocks
    on the disk."""
    import aiofiles
    import aiofiles.os

    path = os.fspath(path)
    tmp = _temp_path(path)
    try:
        async with aiofiles.open(tmp, "xb") as f:
            await f.write(data)
            await f.flush()
            await asyncio.get_running_loop().run_in_executor(None, os.fsync, f.fileno())
        await aiofiles.os.replace(tmp, path)
    except OSError as exc:
        _remove_quietly(tmp)
        raise TierIOError(path, 0, exc.errno or errno.EIO, what="write") from exc
    await asyncio.get_running_loop().run_in_executor(None, _fsync_dir, path)


def read_capped(path: str | os.PathLike, cap: int = MAX_WARM_FILE_BYTES) -> bytes:
    """Read a whole small file, refusing one larger than ``cap`` before reading it.

    Raises FileNotFoundError (missing), FormatError (too large), TierIOError.
    """
    from tierstore.errors import FormatError

    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > cap:
                raise FormatError(f"{path}: file is {size} bytes, larger than the "
                                  f"{cap}-byte cap for a warm-start file")
            data = f.read(cap + 1)
    except FileNotFoundError:
        raise
    except IsADirectoryError as exc:
        raise FormatError(f"{path}: is a directory, expected a warm-start JSON file") from exc
    except OSError as exc:
        raise TierIOError(path, 0, exc.errno or errno.EIO) from exc
    if len(data) > cap:  # grew while we read it
        raise FormatError(f"{path}: larger than the {cap}-byte cap for a warm-start file")
    return data

"""Atomic file output: the one way tierstore writes a file a reader may see.

The bytes go to a temp file in the target's own directory (so the rename stays on one
filesystem), are fsynced, renamed over the target, and the directory is fsynced so the
rename itself survives a crash. Any failure, an interrupt included (KeyboardInterrupt,
SystemExit), closes and removes the temp file and leaves the target as it was: a reader
sees the old file or the new one, never part of one. OSErrors become ``TierIOError``
naming the target.

A writer SIGKILLed mid-write cannot remove its temp file; the next atomic write to that
directory does (``sweep_stale_temps``): only names of this module's own pattern, and
only when their writer is provably gone (its pid, in our pid namespace and boot, is not
running) or they have not been touched for ``STALE_TEMP_AGE_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import glob
import hashlib
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Callable, Iterator
from typing import BinaryIO

from tierstore.errors import TierIOError

TEMP_MARK = ".tmp-"  # temp names are ".<name>.tmp-<pid>-<origin>-<random>" beside the target
# <origin>: 8 hex digits naming this boot and pid namespace, so a sweeper judges a pid
# only where it means the same process; older tierstores wrote ".<name>.tmp-<pid>-<random>".
_TEMP_NAME = re.compile(
    r"\..+\.tmp-(?P<pid>[0-9]{1,10})-(?:(?P<origin>[0-9a-f]{8})-)?"
    r"[0-9a-f]{8}",
    re.DOTALL,
)
STALE_TEMP_AGE_S = 24 * 3600.0  # untouched this long: stale whoever wrote it (a live
# writer's temp is written, fsynced, renamed in one go)


@functools.lru_cache(maxsize=1)
def _origin() -> str:
    """This boot and pid namespace, as 8 hex digits (a pid means one process only there)."""
    parts = []
    for probe in (
        lambda: open("/proc/sys/kernel/random/boot_id").read().strip(),
        lambda: str(os.stat("/proc/self/ns/pid").st_ino),
    ):
        try:
            parts.append(probe())
        except OSError:
            parts.append("?")
    parts.append(os.uname().nodename)
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:8]


def temp_path_for(path: str | os.PathLike) -> str:
    """A fresh temp name in the same directory as ``path`` (hidden, unique per call)."""
    head, tail = os.path.split(os.path.abspath(os.fspath(path)))
    return os.path.join(head, f".{tail}{TEMP_MARK}{os.getpid()}-{_origin()}-{secrets.token_hex(4)}")


def _pid_gone(pid: int) -> bool:
    """True when no process ``pid`` runs here (a zombie's work is over too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # EPERM: it exists, another user's
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read(512).rsplit(b")", 1)[-1].split()[:1] == [b"Z"]
    except OSError:
        return False


def sweep_stale_temps(directory: str | os.PathLike) -> list[str]:
    """Remove the temp files a killed writer left in ``directory``; returns what went.
    Only regular files named by ``temp_path_for``'s pattern; each only when its writer's
    pid (recorded in our boot and pid namespace, not this process) is no longer running,
    or when nobody touched it for STALE_TEMP_AGE_S. A live writer's temp is never
    removed, nor anything else. Never raises: a sweep is housekeeping."""
    removed, now = [], time.time()
    try:
        with os.scandir(os.fspath(directory) or ".") as entries:
            for entry in entries:
                m = _TEMP_NAME.fullmatch(entry.name) if TEMP_MARK in entry.name else None
                if m is None:
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                pid = int(m["pid"])
                stale = now - st.st_mtime >= STALE_TEMP_AGE_S or (
                    m["origin"] == _origin() and pid != os.getpid() and _pid_gone(pid)
                )
                if stale:
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)
                        removed.append(entry.path)
    except OSError:
        pass
    return removed


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


def _io_error(path: str, exc: OSError, offset: int = 0, what: str = "write") -> TierIOError:
    return TierIOError(path, offset, exc.errno or errno.EIO, what=what)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, *, mode: int = 0o644) -> Iterator[BinaryIO]:
    """``with atomic_output(p) as f: f.write(...)``: ``p`` appears, complete, when the
    block ends; nothing of it appears if the block raises. ``f`` is a binary file. A
    failure is a TierIOError naming the step (write, fsync, rename) and the offset the
    file had reached when it failed."""
    path = os.fspath(path)
    tmp = temp_path_for(path)
    sweep_stale_temps(os.path.dirname(tmp))
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    except OSError as exc:
        raise _io_error(path, exc) from exc
    f = os.fdopen(fd, "wb")
    done = False
    step, reached = "write", 0
    try:
        yield f
        f.flush()
        reached = _position(fd)  # after close the fd is gone: keep how far the file got
        step = "fsync"
        os.fsync(fd)
        f.close()
        step = "rename"
        os.replace(tmp, path)
        done = True
    except TierIOError:
        raise  # the block's own error names its own file (a source it read, say)
    except OSError as exc:
        offset = _position(fd) if step == "write" else reached
        raise _io_error(path, exc, offset, step) from exc
    finally:
        if not done:
            try:
                f.close()
            except OSError:
                pass  # the flush of a failed write fails again; the file is going anyway
            remove_quietly(tmp)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def _position(fd: int) -> int:
    """How far the file got: the kernel's offset, i.e. every byte a write landed."""
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


class _Abandoned(Exception):
    """Raised inside the executor's write when its caller was cancelled: atomic_output
    then removes the temp and leaves the target as it was."""


async def write_atomic_async(path: str | os.PathLike, data: bytes | memoryview) -> None:
    """``write_atomic`` for an event loop: aiofiles runs the whole of it (temp, write,
    fsync, rename, directory fsync: ``atomic_output``) in the default executor, so the
    loop never blocks on the disk and a failure is the same TierIOError, naming the
    offset the file reached. A cancelled caller waits for that thread to settle before the
    CancelledError goes on (a write on disk cannot be taken back halfway): cancelled
    before the bytes are all written, the write is abandoned, its temp removed and the
    target left as it was; later, it completes. No temp file outlives the call."""
    import aiofiles.os

    path = os.fspath(path)
    abandon = threading.Event()

    def write(f: BinaryIO) -> None:
        if abandon.is_set():
            raise _Abandoned(path)
        f.write(data)
        if abandon.is_set():
            raise _Abandoned(path)

    job = asyncio.ensure_future(aiofiles.os.wrap(write_atomic_with)(path, write))
    try:
        await asyncio.shield(job)
    except asyncio.CancelledError:
        abandon.set()
        while not job.done():
            try:
                await asyncio.wait([job])
            except asyncio.CancelledError:
                pass  # cancelled again: the thread still has to settle first
        if not job.cancelled():
            job.exception()  # retrieved: the caller hears of its cancel, not of this
        raise


def create_sized_atomic(path: str | os.PathLike, size: int) -> int:
    """Create ``path`` as a sparse file of ``size`` bytes, atomically, and return an
    O_RDWR descriptor on it (the caller owns it). Used for pack files, whose rows are
    then written in place with pwrite + fdatasync."""
    path = os.fspath(path)
    tmp = temp_path_for(path)
    sweep_stale_temps(os.path.dirname(tmp))
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise _io_error(path, exc) from exc
    done = False
    step = "truncate"  # the file is extended to ``size``: each step fails at that offset
    try:
        os.ftruncate(fd, size)  # sparse: unwritten rows stay holes
        step = "fsync"
        os.fsync(fd)
        step = "rename"
        os.rename(tmp, path)
        done = True
    except OSError as exc:
        raise _io_error(path, exc, size, step) from exc
    finally:
        if not done:
            os.close(fd)
            remove_quietly(tmp)
    fsync_dir(os.path.dirname(os.path.abspath(path)))
    return fd

"""Writer / live-reader coordination on a pack's ``<stem>.lock`` (docs/FORMAT.md,
"Readers and writers").

A PackWriter holds ``flock(LOCK_EX)`` on the lock file for its lifetime; a live
ExpertStore holds ``flock(LOCK_SH)`` on it for its lifetime. So a writer can never
rewrite rows under a store that is serving them (no torn row, whatever ``verify``
says), and a store never starts on a pack a writer is changing: the second party gets
a PackBusyError naming the pack and who holds it (pids from /proc/locks where Linux
has them). flock locks belong to an open file description, so two parties of one
process exclude each other too.
"""
from __future__ import annotations

import errno
import fcntl
import os

from tierstore.errors import TierIOError


class PackBusyError(TierIOError):
    """The pack's `.lock` is held: by a writer (a store or another writer cannot start)
    or by live readers (a writer cannot start)."""

    def __init__(self, lock_path: str, message: str):
        super().__init__(lock_path, 0, errno.EWOULDBLOCK, what="lock")
        self.args = (errno.EWOULDBLOCK, f"{lock_path}: {message}")


def holders(lock_path: str) -> list[tuple[int, str]]:
    """(pid, "READ"/"WRITE") of the flock holders of ``lock_path`` per /proc/locks;
    empty where that is unavailable (other systems, containers that hide it)."""
    try:
        st = os.stat(lock_path)
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read(1 << 20).splitlines()
    except OSError:
        return []
    want = f":{st.st_ino}"
    out = []
    for line in lines:
        parts = line.split()
        if "->" in parts:             # a waiter, not a holder
            continue
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5].endswith(want):
            dev = parts[5].rsplit(":", 1)[0].split(":")
            if len(dev) == 2 and os.makedev(int(dev[0], 16), int(dev[1], 16)) != st.st_dev:
                continue
            try:
                out.append((int(parts[4]), parts[3]))
            except ValueError:
                continue
    return out


def _who(lock_path: str, kind: str) -> str:
    pids = sorted({pid for pid, k in holders(lock_path) if k == kind})
    return f" (pid {', '.join(map(str, pids))})" if pids else ""


def _open_lock_file(lock_path: str, create: bool) -> int:
    flags = os.O_CLOEXEC | os.O_NONBLOCK   # a FIFO in its place must not block the open
    if create:
        return os.open(lock_path, flags | os.O_RDWR | os.O_CREAT, 0o644)
    return os.open(lock_path, flags | os.O_RDONLY)


def lock_for_writing(lock_path: str) -> int:
    """The writer's exclusive lock: its fd (closing it drops the lock). PackBusyError
    when another writer or a live store holds the lock; TierIOError naming the lock
    file when it cannot be created (a read-only, full or foreign directory)."""
    try:
        fd = _open_lock_file(lock_path, create=True)
    except OSError as exc:
        raise TierIOError(lock_path, 0, exc.errno or errno.EIO, what="lock open") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:
        pass
    except BaseException:
        os.close(fd)
        raise
    try:   # who? a shared lock we can take means only readers hold it
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        readers = True
    except BlockingIOError:
        readers = False
    finally:
        os.close(fd)
    if readers:
        raise PackBusyError(lock_path, f"a live reader (ExpertStore){_who(lock_path, 'READ')} "
                                       f"is serving this pack; close it before rewriting, "
                                       f"or write a new pack and rename it into place")
    raise PackBusyError(lock_path, f"another writer holds this pack's lock"
                                   f"{_who(lock_path, 'WRITE')}")


def lock_for_reading(pack_path: str, lock_path: str) -> int:
    """A live reader's shared lock: its fd, or -1 when the lock file can be neither
    opened nor created (a read-only directory without one: no PackWriter can lock it
    either). PackBusyError naming the pack when a writer holds it."""
    try:
        fd = _open_lock_file(lock_path, create=True)
    except OSError:
        try:
            fd = _open_lock_file(lock_path, create=False)
        except OSError:
            return -1
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:
        os.close(fd)
        raise PackBusyError(lock_path, f"{os.path.basename(pack_path)} is being written by a "
                                       f"PackWriter{_who(lock_path, 'WRITE')}; open the store "
                                       f"once the writer has finished") from None
    except BaseException:
        os.close(fd)
        raise


__all__ = ["PackBusyError", "holders", "lock_for_reading", "lock_for_writing"]

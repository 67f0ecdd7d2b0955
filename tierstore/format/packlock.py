"""Writer / live-reader coordination on a pack's ``<stem>.lock`` (docs/FORMAT.md,
"Readers and writers").

A PackWriter holds ``flock(LOCK_EX)`` on the lock file for its lifetime; a live
ExpertStore holds ``flock(LOCK_SH)`` on it for its lifetime. So a writer can never
rewrite rows under a store that is serving them (no torn row, whatever ``verify``
says), and a store never starts on a pack a writer is changing: the second party gets
a PackBusyError naming the pack and who holds it (pids from /proc/locks where Linux
has them). flock locks belong to an open file description, so two parties of one
process exclude each other too.

The lock file is opened with O_NOFOLLOW and checked (a regular file; in a sticky shared
directory, ours or the directory owner's) before it is locked: a planted ``<stem>.lock``
symlink or FIFO is refused, never created or locked through. A writer that fails on a
pack it created removes the lock file too, while holding it: whoever opened that file
meanwhile finds it no longer named after its flock and opens the new one.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat

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
        if "->" in parts:  # a waiter, not a holder
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


class LockFileError(TierIOError):
    """The pack's `.lock` path names something a lock must not be taken on: a symbolic
    link, a FIFO, a directory, or (in a sticky shared directory such as /tmp) a file
    another user planted. Nothing was created or locked through it."""

    def __init__(self, lock_path: str, err: int, message: str):
        super().__init__(lock_path, 0, err, what="lock open")
        self.args = (err, f"{lock_path}: {message}")


def _refuse_planted(lock_path: str, fd: int) -> None:
    """A lock file is ours to flock only when it is a regular file, and, in a sticky
    directory others may write (/tmp-like), owned by us or by the directory's owner (the
    kernel's protected_regular rule): anything else is a file planted to make us lock
    (or, with O_CREAT, create) something else."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise LockFileError(
            lock_path,
            errno.EINVAL,
            "is not a regular file; a pack's lock file must be an empty regular file: remove what is there",
        )
    if st.st_uid == os.geteuid():
        return
    try:
        d = os.stat(os.path.dirname(os.path.abspath(lock_path)))
    except OSError:
        return
    shared = d.st_mode & stat.S_ISVTX and d.st_mode & (stat.S_IWOTH | stat.S_IWGRP)
    if shared and st.st_uid != d.st_uid:
        raise LockFileError(
            lock_path,
            errno.EPERM,
            f"owned by uid {st.st_uid}, neither you nor the owner of this "
            f"shared sticky directory; refusing a lock file another user "
            f"may have planted (remove it, or keep packs in a private "
            f"directory)",
        )


def _open_lock_file(lock_path: str, create: bool) -> tuple[int, bool]:
    """(fd, created): the lock file opened without following a symbolic link (O_NOFOLLOW:
    a planted ``<stem>.lock`` link never makes us create or lock a file elsewhere) and
    checked (``_refuse_planted``). ``created``: this call made the file (O_EXCL), so a
    writer that fails may remove it again. A FIFO in its place must not block the open
    (O_NONBLOCK); it is refused after."""
    flags = os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW
    created = False
    try:
        if not create:
            fd = os.open(lock_path, flags | os.O_RDONLY)
        else:
            for _ in range(8):  # created and removed by others between our two opens
                try:
                    fd = os.open(lock_path, flags | os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                    created = True
                    break
                except FileExistsError:
                    pass
                try:
                    fd = os.open(lock_path, flags | os.O_RDWR)
                    break
                except FileNotFoundError:
                    continue
            else:
                raise TierIOError(lock_path, 0, errno.EAGAIN, what="lock open")
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(lock_path):
            raise LockFileError(
                lock_path,
                errno.ELOOP,
                "is a symbolic link; a pack's lock file must be a regular "
                "file (nothing was created or locked through the link): "
                "remove it",
            ) from None
        raise
    try:
        _refuse_planted(lock_path, fd)
    except BaseException:
        os.close(fd)
        raise
    return fd, created


_RETRIES = 64  # opens of a lock file that others keep removing, before giving up


def _still_named(lock_path: str, fd: int) -> bool:
    """True when ``lock_path`` still names the file ``fd`` locked. A failed fresh build
    removes the lock file it created (holding LOCK_EX): whoever opened that file before
    the unlink then holds a lock on a nameless inode and must open the new one."""
    try:
        a, b = os.fstat(fd), os.stat(lock_path, follow_symlinks=False)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def lock_for_writing(lock_path: str) -> tuple[int, bool]:
    """The writer's exclusive lock: (fd, created) -- closing the fd drops the lock;
    ``created`` when this call made the lock file (a failed fresh writer removes it
    again). PackBusyError when another writer or a live store holds the lock;
    LockFileError for a planted link, FIFO or foreign file; TierIOError naming the lock
    file when it cannot be created (a read-only, full or foreign directory)."""
    for _ in range(_RETRIES):
        try:
            fd, created = _open_lock_file(lock_path, create=True)
        except LockFileError:
            raise
        except OSError as exc:
            raise TierIOError(lock_path, 0, exc.errno or errno.EIO, what="lock open") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            break
        except BaseException:
            os.close(fd)
            raise
        if _still_named(lock_path, fd):
            return fd, created
        os.close(fd)  # locked a lock file its writer removed meanwhile: take the new one
    else:
        raise TierIOError(lock_path, 0, errno.EAGAIN, what="lock (the file kept changing)")
    try:  # who? a shared lock we can take means only readers hold it
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        readers = True
    except BlockingIOError:
        readers = False
    finally:
        os.close(fd)
    if readers:
        raise PackBusyError(
            lock_path,
            f"a live reader (ExpertStore){_who(lock_path, 'READ')} "
            f"is serving this pack; close it before rewriting, "
            f"or write a new pack and rename it into place",
        )
    raise PackBusyError(
        lock_path,
        f"another writer holds this pack's lock"
        f"{_who(lock_path, 'WRITE')}; wait for it to finish "
        f"(or end it: a killed writer's pack resumes)",
    )


def lock_for_reading(pack_path: str, lock_path: str) -> int:
    """A live reader's shared lock: its fd, or -1 when the lock file can be neither
    opened nor created (a read-only directory without one: no PackWriter can lock it
    either). PackBusyError naming the pack when a writer holds it; LockFileError for a
    planted link, FIFO or foreign file (never created or locked through)."""
    for _ in range(_RETRIES):
        try:
            fd, _ = _open_lock_file(lock_path, create=True)
        except LockFileError:
            raise
        except OSError:
            try:
                fd, _ = _open_lock_file(lock_path, create=False)
            except LockFileError:
                raise
            except OSError:
                return -1
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise PackBusyError(
                lock_path,
                f"{os.path.basename(pack_path)} is being written "
                f"by a PackWriter{_who(lock_path, 'WRITE')}; open "
                f"the store once the writer has finished",
            ) from None
        except BaseException:
            os.close(fd)
            raise
        if _still_named(lock_path, fd):
            return fd
        os.close(fd)  # a failed writer removed the file we locked: lock the new one
    raise TierIOError(lock_path, 0, errno.EAGAIN, what="lock (the file kept changing)")


__all__ = ["LockFileError", "PackBusyError", "holders", "lock_for_reading", "lock_for_writing"]

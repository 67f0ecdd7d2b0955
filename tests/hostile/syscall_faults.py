"""Failing system calls for the writers: ``SyscallFault`` makes the nth call of one os
function fail with an errno (ENOSPC, EDQUOT, EIO, EXDEV ...), or, for the byte
writers (os.pwrite, the FileIO under ``os.fdopen``), lets the first
``at_byte`` bytes land and fails the write that would pass them: a disk filling up
mid-file. Everything else runs for real (real files, real fsync and rename); only the
one call a full disk, a quota or a dying device would fail is made to fail."""

from __future__ import annotations

import io
import os

PATCHABLE = ("open", "ftruncate", "fsync", "fdatasync", "replace", "rename", "makedirs", "pwrite", "write")


class _FullFileIO(io.FileIO):
    """A FileIO whose writes past ``budget`` bytes fail (a short write first)."""

    def __init__(self, *args, fault: SyscallFault, **kw):
        super().__init__(*args, **kw)
        self._fault = fault

    def write(self, b):
        n = self._fault.allow(len(memoryview(b)))
        if n == 0:
            raise OSError(self._fault.err, os.strerror(self._fault.err))
        return super().write(memoryview(b)[:n])


class SyscallFault:
    """``with SyscallFault("fsync", errno.EIO, nth=2):`` the 2nd os.fsync in the block
    fails. name "write": byte writes through os.fdopen (FileIO) fail
    once ``at_byte`` bytes landed; "pwrite" the same for os.pwrite. ``match``: only
    calls whose path argument contains it count (os.open, os.makedirs, os.replace ...).
    ``fired`` tells whether the fault happened (a case whose fault never fired is no
    case)."""

    def __init__(
        self, name: str, err: int, *, nth: int = 1, at_byte: int | None = None, match: str | None = None
    ):
        assert name in PATCHABLE, name
        self.name, self.err, self.nth, self.at_byte, self.match = name, err, nth, at_byte, match
        self.calls = 0
        self.written = 0
        self.fired = False
        self._saved = []

    # -- byte budget (write / pwrite) -------------------------------------------------
    def allow(self, n: int) -> int:
        """How many of ``n`` bytes this write may land (0: it fails)."""
        budget = (self.at_byte or 0) - self.written
        if budget <= 0:
            self.fired = True
            return 0
        k = min(n, budget)
        self.written += k
        return k

    def _error(self, what) -> OSError:
        self.fired = True
        return OSError(self.err, os.strerror(self.err), what)

    def _counts(self, path) -> bool:
        if self.match is not None and self.match not in os.fspath(path):
            return False
        self.calls += 1
        return self.calls == self.nth

    # -- patching -----------------------------------------------------------------------
    def _set(self, owner, attr, value):
        self._saved.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, value)

    def __enter__(self) -> SyscallFault:
        real = getattr(os, self.name) if self.name != "write" else None
        if self.name == "write":
            self._patch_file_writes()
        elif self.name == "pwrite":

            def pwrite(fd, data, offset):
                n = self.allow(len(memoryview(data)))
                if n == 0:
                    raise self._error(None)
                return real(fd, memoryview(data)[:n], offset)

            self._set(os, "pwrite", pwrite)
        elif self.name in ("fsync", "fdatasync", "ftruncate"):

            def on_fd(fd, *rest):
                if self._counts(""):
                    raise self._error(None)
                return real(fd, *rest)

            self._set(os, self.name, on_fd)
        else:  # open, replace, rename, makedirs: the first argument is the path

            def on_path(path, *rest, **kw):
                if self._counts(path):
                    raise self._error(os.fspath(path))
                return real(path, *rest, **kw)

            self._set(os, self.name, on_path)
        return self

    def _patch_file_writes(self) -> None:
        fault, real_fdopen = self, os.fdopen

        def fdopen(fd, mode="r", *args, **kw):
            if "b" in mode and ("w" in mode or "a" in mode or "x" in mode):
                return io.BufferedWriter(_FullFileIO(fd, "wb", closefd=True, fault=fault))
            return real_fdopen(fd, mode, *args, **kw)

        self._set(os, "fdopen", fdopen)

    def __exit__(self, *exc) -> None:
        for owner, attr, value in reversed(self._saved):
            setattr(owner, attr, value)
        self._saved.clear()


__all__ = ["SyscallFault", "PATCHABLE"]

"""One exception family for tierstore.

Every message names what a user needs to act: the file, the byte offset, the
layer/expert, and what was expected against what was found, e.g.
``experts.pack: layer 3 expert 12 at offset 0x1f000: length 4096, expected 8192``.
"""

from __future__ import annotations

import errno as _errno
import os


def one_line(text: str) -> str:
    """``text`` with line breaks and other control characters escaped: a message names
    files, and a file name may hold a newline; the message must stay one line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


class TierstoreError(Exception):
    """Base class of every error tierstore raises on purpose. Its message is one line
    whatever the names in it hold (``one_line``)."""

    def __str__(self) -> str:
        return one_line(super().__str__())


class FormatError(TierstoreError, ValueError):
    """A file (pack, sidecar, warm-start file, trace) is malformed or does not match."""


class ConfigError(TierstoreError, ValueError):
    """An argument, setting or environment variable is invalid or unsupported."""


class CapacityError(ConfigError):
    """A pool or arena cannot be sized as asked (under the fire floor, larger than memory)."""


class BufferBoundsError(ConfigError):
    """An engine row points outside the memory registered with the engine (a caller bug:
    nothing was read or copied). The message names the row, its file offset and length,
    the pointer and the buffer it points into."""


class TierIOError(TierstoreError, OSError):
    """A read or write failed. Carries ``path``, ``offset`` and ``errno``."""

    def __init__(self, path: str | os.PathLike, offset: int, err: int, what: str = "read"):
        self.path = os.fspath(path)
        self.offset = int(offset)
        name = _errno.errorcode.get(err, str(err))
        super().__init__(
            err,
            f"{self.path}: {what} at offset {self.offset:#x} failed: "
            f"{name} ({os.strerror(err) if err > 0 else 'unknown'})",
        )
        self.filename = self.path

    def __str__(self) -> str:  # OSError's default adds "[Errno n]" noise
        return one_line(self.args[1])


class ClosedError(TierstoreError, RuntimeError):
    """The store or engine was used after close()."""


class ForkedError(ClosedError):
    """A store, engine, promotion ticket or read batch of the parent process was used in a
    fork()ed child: the threads that run it stayed in the parent. Open a new store in the
    child (tierstore/process.py)."""

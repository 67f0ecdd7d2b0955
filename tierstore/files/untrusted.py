"""Reading files tierstore did not write: the one strict path for untrusted bytes.

Every file the product reads from a user (pack sidecars, warm-start files, trace
metadata) comes through here, checked in this order, in bounded time and memory:

1. open without blocking (``O_NONBLOCK``: a FIFO or a device never hangs ``open``), then
   ``fstat``: only a regular file is read;
2. its size against a cap, before a byte is read;
3. JSON: nesting depth by a linear, vectorised scan (no regex backtracking, no
   recursion), then a strict parse (no duplicate keys, no NaN / Infinity).

Errors are ``FormatError`` (what the file holds) or ``TierIOError`` (the read failed),
each naming the file; a missing file is ``FileNotFoundError``, left to the caller who
knows whether that is an error or a cold start.
"""
from __future__ import annotations

import errno
import json
import os
import stat

import numpy as np

from tierstore.errors import FormatError, TierIOError

DEFAULT_MAX_DEPTH = 32
# No field of a file tierstore reads holds a long string (tags, ids, versions): a longer
# one is hostile, and refusing it before the parse keeps a megabyte flood of escaped
# quotes from costing seconds in json.loads.
DEFAULT_MAX_STRING = 1 << 16


def open_regular(path: str | os.PathLike, what: str = "file") -> int:
    """An O_RDONLY descriptor on ``path``, refused unless it is a regular file.

    Raises FileNotFoundError, FormatError (a directory, FIFO, socket or device) or
    TierIOError (any other failure to open)."""
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except IsADirectoryError:
        raise FormatError(f"{path}: is a directory, expected a {what}") from None
    except OSError as exc:
        raise TierIOError(path, 0, exc.errno or errno.EIO, what="open") from exc
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise FormatError(f"{path}: is a directory, expected a {what}")
        if not stat.S_ISREG(st.st_mode):
            raise FormatError(f"{path}: is not a regular file ({_kind(st.st_mode)}), "
                              f"expected a {what}")
        os.set_blocking(fd, True)  # a regular file: reads never block on the fd flag anyway
    except BaseException:
        os.close(fd)
        raise
    return fd


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def read_capped(path: str | os.PathLike, cap: int, what: str = "file") -> bytes:
    """The whole of a small regular file, refused when larger than ``cap`` bytes (checked
    before reading, and again against a file that grows while it is read)."""
    path = os.fspath(path)
    fd = open_regular(path, what)
    try:
        size = os.fstat(fd).st_size
        if size > cap:
            raise FormatError(f"{path}: {what} is {size} bytes, larger than the {cap}-byte cap")
        chunks, got = [], 0
        while got <= cap:
            piece = os.read(fd, min(cap + 1 - got, 1 << 20))
            if not piece:
                break
            chunks.append(piece)
            got += len(piece)
    except OSError as exc:
        if isinstance(exc, FormatError):
            raise
        raise TierIOError(path, 0, exc.errno or errno.EIO) from exc
    finally:
        os.close(fd)
    if got > cap:
        raise FormatError(f"{path}: {what} grew larger than the {cap}-byte cap while being read")
    return b"".join(chunks)


_SCAN_CHUNK = 1 << 18   # bytes per vectorised step: ~40 bytes of scratch per byte


def json_shape(raw: bytes, stop_depth: int | None = None,
               stop_string: int | None = None) -> tuple[int, int]:
    """(deepest ``[`` / ``{`` nesting, longest string in bytes) of a JSON text.

    Linear time and bounded memory: the text is scanned in chunks of _SCAN_CHUNK bytes
    (a state of four numbers is carried across), so a 64 MiB file costs ~10 MiB of
    scratch, not 40 bytes per input byte. A quote is a string boundary unless an odd
    run of backslashes precedes it; brackets count only outside strings. The scan
    stops early once ``stop_depth`` or ``stop_string`` is exceeded (a hostile file is
    refused after its first bad chunk, not after all of it)."""
    n = len(raw)
    depth = deepest = longest = 0
    bs_run = 0                   # backslashes just before the chunk
    str_start = -1               # offset of the open quote when inside a string
    for start in range(0, n, _SCAN_CHUNK):
        b = np.frombuffer(raw, dtype=np.uint8, count=min(_SCAN_CHUNK, n - start), offset=start)
        m = b.size
        idx = np.arange(m, dtype=np.int64)
        last = np.maximum.accumulate(np.where(b == 0x5C, -1, idx))   # last non-backslash <= i
        run_before = np.empty(m, dtype=np.int64)
        run_before[0] = bs_run
        run_before[1:] = np.where(last[:-1] >= 0, idx[:-1] - last[:-1], idx[1:] + bs_run)
        quote = (b == 0x22) & (run_before % 2 == 0)
        in_str = str_start >= 0
        inside = ((np.cumsum(quote) + in_str) % 2).astype(bool) | quote
        step = (((b == 0x5B) | (b == 0x7B)) & ~inside).astype(np.int64) \
            - (((b == 0x5D) | (b == 0x7D)) & ~inside)
        levels = np.cumsum(step) + depth
        deepest = max(deepest, int(levels.max(initial=depth)))
        depth = int(levels[-1])
        bounds = np.flatnonzero(quote) + start
        if in_str:
            bounds = np.concatenate([[str_start], bounds])
        pairs = bounds.size // 2
        if pairs:
            longest = max(longest, int((bounds[1:2 * pairs:2] - bounds[0:2 * pairs:2]).max()) - 1)
        str_start = int(bounds[-1]) if bounds.size % 2 else -1
        if str_start >= 0:
            longest = max(longest, start + m - str_start - 1)   # a string still open
        bs_run = bs_run + m if last[-1] < 0 else m - 1 - int(last[-1])
        if (stop_depth is not None and deepest > stop_depth) or \
                (stop_string is not None and longest > stop_string):
            break
    return deepest, longest


def json_nesting_depth(raw: bytes) -> int:
    """Deepest ``[`` / ``{`` nesting of a JSON text, brackets inside strings ignored
    (``json_shape``: linear time, bounded memory)."""
    return json_shape(raw)[0]


def _reject_duplicate_keys(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _reject_constant(name):
    raise ValueError(f"non-JSON number {name}")


def loads_strict(raw: bytes, path: str, what: str = "JSON file",
                 max_depth: int = DEFAULT_MAX_DEPTH, max_string: int = DEFAULT_MAX_STRING):
    """Parse untrusted JSON bytes: depth and string lengths first (one linear scan),
    then strict json (duplicate keys and NaN / Infinity refused). FormatError naming
    ``path`` and ``what``."""
    deepest, longest = json_shape(raw, max_depth, max_string)
    if deepest > max_depth:
        raise FormatError(f"{path}: {what} JSON is nested too deeply "
                          f"(more than {max_depth} levels)")
    if longest > max_string:
        raise FormatError(f"{path}: {what} JSON holds a string of more than {max_string} "
                          f"bytes (no field is that long)")
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_reject_duplicate_keys,
                          parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        detail = "truncated" if exc.pos >= len(exc.doc.rstrip()) else str(exc)
        raise FormatError(f"{path}: {what} is not valid JSON: {detail}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise FormatError(f"{path}: {what} is not valid JSON: {exc}") from None
    except RecursionError:
        raise FormatError(f"{path}: {what} JSON is nested too deeply") from None


def read_json(path: str | os.PathLike, cap: int, what: str = "JSON file",
              max_depth: int = DEFAULT_MAX_DEPTH, max_string: int = DEFAULT_MAX_STRING):
    """``read_capped`` then ``loads_strict``."""
    path = os.fspath(path)
    return loads_strict(read_capped(path, cap, what), path, what, max_depth, max_string)

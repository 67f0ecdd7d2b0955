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
from typing import NamedTuple

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
            raise FormatError(f"{path}: is not a regular file ({file_kind(st.st_mode)}), expected a {what}")
        os.set_blocking(fd, True)  # a regular file: reads never block on the fd flag anyway
    except BaseException:
        os.close(fd)
        raise
    return fd


def file_kind(mode: int) -> str:
    """What a non-regular file is, from its ``st_mode`` ("a FIFO", "a directory" ...)."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
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
        step = size + 1  # the whole file in one read (one buffer, no join copy);
        while got <= cap:  # the extra byte tells a file that grew meanwhile
            piece = os.read(fd, min(cap + 1 - got, max(step, 1 << 20)))
            if not piece:
                break
            chunks.append(piece)
            got += len(piece)
            step = 0
    except OSError as exc:
        if isinstance(exc, FormatError):
            raise
        raise TierIOError(path, 0, exc.errno or errno.EIO) from exc
    finally:
        os.close(fd)
    if got > cap:
        raise FormatError(f"{path}: {what} grew larger than the {cap}-byte cap while being read")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


_SCAN_CHUNK = 1 << 18  # bytes per vectorised step: ~40 bytes of scratch per byte


class _Chunk(NamedTuple):
    start: int  # offset of the chunk in the text
    b: np.ndarray  # its bytes
    quote: np.ndarray  # True at a quote that opens or closes a string
    outside: np.ndarray  # True at a byte outside every string (quotes excluded)
    levels: np.ndarray  # nesting depth after each byte
    depth: int  # nesting depth before the chunk


def _scan_chunks(raw):
    """The JSON text ``raw`` (any buffer) in chunks of _SCAN_CHUNK bytes, each with its
    string and nesting state, vectorised: a quote is a string boundary unless an odd
    run of backslashes precedes it; brackets count only outside strings. Carries four
    numbers across chunks, so scratch stays ~40 bytes per chunk byte whatever the size."""
    n = len(raw) if not isinstance(raw, memoryview) else raw.nbytes
    depth = 0
    bs_run = 0  # backslashes just before the chunk
    in_str = False
    for start in range(0, n, _SCAN_CHUNK):
        b = np.frombuffer(raw, dtype=np.uint8, count=min(_SCAN_CHUNK, n - start), offset=start)
        m = b.size
        idx = np.arange(m, dtype=np.int64)
        last = np.maximum.accumulate(np.where(b == 0x5C, -1, idx))  # last non-backslash <= i
        run_before = np.empty(m, dtype=np.int64)
        run_before[0] = bs_run
        run_before[1:] = np.where(last[:-1] >= 0, idx[:-1] - last[:-1], idx[1:] + bs_run)
        quote = (b == 0x22) & (run_before % 2 == 0)
        parity = np.cumsum(quote) + in_str
        outside = ~(((parity % 2).astype(bool)) | quote)
        step = (((b == 0x5B) | (b == 0x7B)) & outside).astype(np.int64) - (
            ((b == 0x5D) | (b == 0x7D)) & outside
        )
        levels = np.cumsum(step) + depth
        yield _Chunk(start, b, quote, outside, levels, depth)
        depth = int(levels[-1])
        in_str = bool(int(parity[-1]) % 2)
        bs_run = bs_run + m if last[-1] < 0 else m - 1 - int(last[-1])


class JsonCensus(NamedTuple):
    """What a JSON text holds, counted without parsing it (``json_census``)."""

    depth: int  # deepest ``[`` / ``{`` nesting
    longest: int  # longest string, in bytes
    items: int  # commas, colons and opening brackets outside strings: about one
    # per value, key and container json.loads would make an object of
    containers: int  # opening brackets outside strings


class JsonBudget(NamedTuple):
    """How much a JSON text may hold before it is parsed: ``items`` and ``containers``
    as ``json_census`` counts them; ``why`` says what the limits follow from (for the
    error: "... more than 4,200 items, all a sidecar of 2 layers x 3 experts holds")."""

    items: int
    containers: int
    why: str


def json_census(
    raw, stop_depth: int | None = None, stop_string: int | None = None, budget: JsonBudget | None = None
) -> JsonCensus:
    """Nesting, longest string and how many items and containers a JSON text holds, in
    one linear scan with bounded scratch (``_scan_chunks``). The scan stops early once a
    limit is exceeded (a hostile file is refused after its first bad chunk)."""
    deepest = longest = items = containers = 0
    str_start = -1  # offset of the open quote when inside a string
    for c in _scan_chunks(raw):
        start, m = c.start, c.b.size
        deepest = max(deepest, int(c.levels.max(initial=c.depth)))
        bounds = np.flatnonzero(c.quote) + start
        if str_start >= 0:
            bounds = np.concatenate([[str_start], bounds])
        pairs = bounds.size // 2
        if pairs:
            longest = max(longest, int((bounds[1 : 2 * pairs : 2] - bounds[0 : 2 * pairs : 2]).max()) - 1)
        str_start = int(bounds[-1]) if bounds.size % 2 else -1
        if str_start >= 0:
            longest = max(longest, start + m - str_start - 1)  # a string still open
        if budget is not None:
            opens = int(np.count_nonzero(((c.b == 0x5B) | (c.b == 0x7B)) & c.outside))
            containers += opens
            items += opens + int(np.count_nonzero(((c.b == 0x2C) | (c.b == 0x3A)) & c.outside))
        if (
            (stop_depth is not None and deepest > stop_depth)
            or (stop_string is not None and longest > stop_string)
            or (budget is not None and (items > budget.items or containers > budget.containers))
        ):
            break
    return JsonCensus(deepest, longest, items, containers)


def json_shape(raw: bytes, stop_depth: int | None = None, stop_string: int | None = None) -> tuple[int, int]:
    """(deepest ``[`` / ``{`` nesting, longest string in bytes) of a JSON text, in
    linear time and bounded memory (``json_census``): a 64 MiB file costs ~10 MiB of
    scratch. Stops early once ``stop_depth`` or ``stop_string`` is exceeded."""
    return tuple(json_census(raw, stop_depth, stop_string)[:2])


def json_array_runs(raw, per_run: int) -> tuple[int, list[tuple[int, int]]]:
    """For ``raw``, the text of one valid JSON array (a decoder has checked it): how many
    elements it holds, and byte ranges ``[start, end)`` that each hold at most
    ``per_run`` whole elements (commas between them, no brackets around), covering them
    all in order. One linear scan, bounded scratch: a caller decodes a huge array run
    by run instead of all at once."""
    first = last = -1
    count = solid = 0  # separators; non-blank bytes inside (the "[" included)
    cut = []
    for c in _scan_chunks(raw):
        inner = c.levels >= 1
        if first < 0:
            opened = np.flatnonzero(inner)
            if opened.size:
                first = c.start + int(opened[0]) + 1
        blank = (c.b == 0x20) | (c.b == 0x09) | (c.b == 0x0A) | (c.b == 0x0D)
        solid += int(np.count_nonzero(inner & ~blank))
        seps = np.flatnonzero(c.outside & (c.levels == 1) & (c.b == 0x2C)) + c.start
        if seps.size:
            k = np.arange(count + 1, count + 1 + seps.size)
            cut.extend(int(x) for x in seps[k % per_run == 0])
            count += int(seps.size)
        closed = np.flatnonzero(c.outside & (c.b == 0x5D) & (c.levels == 0))
        if closed.size:
            last = c.start + int(closed[-1])
    if first < 0 or last < first or solid <= 1:
        return 0, []
    runs, begin = [], first
    for x in cut:
        runs.append((begin, x))
        begin = x + 1
    runs.append((begin, last))
    return count + 1, runs


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


def loads_strict(
    raw: bytes,
    path: str,
    what: str = "JSON file",
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_string: int = DEFAULT_MAX_STRING,
    budget: JsonBudget | None = None,
):
    """Parse untrusted JSON bytes: depth, string lengths and (with ``budget``) how many
    items and containers it holds first (one linear scan), then strict json (duplicate
    keys and NaN / Infinity refused). The budget keeps the parse's memory in proportion
    to what the file describes: json.loads spends ~50-90 bytes per item, so a 64 MiB
    text of ``[],[],...`` would cost 1.5 GB. FormatError naming ``path`` and ``what``."""
    deepest, longest, items, containers = json_census(raw, max_depth, max_string, budget)
    if deepest > max_depth:
        raise FormatError(f"{path}: {what} JSON is nested too deeply (more than {max_depth} levels)")
    if longest > max_string:
        raise FormatError(
            f"{path}: {what} JSON holds a string of more than {max_string} bytes (no field is that long)"
        )
    if budget is not None and (items > budget.items or containers > budget.containers):
        count, limit, kind = (
            (containers, budget.containers, "arrays/objects")
            if containers > budget.containers
            else (items, budget.items, "values")
        )
        raise FormatError(
            f"{path}: {what} JSON holds more than {limit:,} {kind} ({count:,} "
            f"counted before stopping), more than {budget.why}; refused "
            f"before parsing"
        )
    try:
        return json.loads(
            raw.decode("utf-8"), object_pairs_hook=_reject_duplicate_keys, parse_constant=_reject_constant
        )
    except json.JSONDecodeError as exc:
        detail = "truncated" if exc.pos >= len(exc.doc.rstrip()) else str(exc)
        raise FormatError(f"{path}: {what} is not valid JSON: {detail}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise FormatError(f"{path}: {what} is not valid JSON: {exc}") from None
    except RecursionError:
        raise FormatError(f"{path}: {what} JSON is nested too deeply") from None


def read_json(
    path: str | os.PathLike,
    cap: int,
    what: str = "JSON file",
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_string: int = DEFAULT_MAX_STRING,
    budget=None,
):
    """``read_capped`` then ``loads_strict``. ``budget``: a JsonBudget, or a function
    of the raw bytes returning one (the limits may follow from what the file says)."""
    path = os.fspath(path)
    raw = read_capped(path, cap, what)
    if callable(budget):
        budget = budget(raw)
    return loads_strict(raw, path, what, max_depth, max_string, budget)

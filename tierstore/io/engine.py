"""Python face of the native I/O engine (``tierstore._C``).

An :class:`Engine` owns one open file, a pool of native reader threads and, on
``device="cuda"``, a CUDA copy stream. :meth:`Engine.submit` takes one batch of
rows as plain integer columns (file offsets, lengths, source and destination
addresses) and returns a :class:`Completion`. Rows are read in parallel chunks
with the GIL released; each chunk's copy (H2D on the copy stream, or memcpy into
host memory) is issued as soon as that chunk's read lands.

Row semantics (docs/INTERNALS.md has the engine's place among the layers):

* ``file_offsets[i] >= 0``: read ``lengths[i]`` bytes there into ``src_ptrs[i]``;
  ``src_ptrs[i] == 0`` reads into ``dst_ptrs[i]`` when that is host memory, else
  into the engine's own bounded ring of pinned staging buffers.
* ``file_offsets[i] == -1``: no read; ``src_ptrs[i]`` already holds the bytes.
* ``dst_ptrs[i] != 0``: then copy to it; ``0``: read only.

The caller keeps every buffer alive until the completion is done (device
copies: until the batch's event fired, i.e. ``synchronize()`` or work ordered
after ``stream_wait``).
"""

from __future__ import annotations

import contextlib
import errno as _errno
import logging
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from tierstore import _C, process, settings
from tierstore.errors import BufferBoundsError, ClosedError, ConfigError, TierIOError
from tierstore.files.untrusted import open_regular
from tierstore.io.buffers import BufferTable

log = logging.getLogger("tierstore.engine")
_fallback_logged: set[str] = set()

SOURCES = ("arena", "pagecache", "disk")
_DIRECT_MODES = ("auto", "on", "off")


def _io_error(path: str, offset: int, err: int, message: str, **attrs: Any) -> TierIOError:
    """A TierIOError whose text is the engine's own one-line message."""
    exc = TierIOError(path, max(offset, 0), err or _errno.EIO)
    exc.args = (exc.errno, message)
    for key, value in attrs.items():
        setattr(exc, key, value)
    return exc


def _from_native(exc: OSError) -> TierIOError:
    message = (exc.strerror or str(exc)).split(" [")[0]  # drop the C++ source location
    return _io_error(exc.filename, getattr(exc, "offset", -1), exc.errno, message)


def _column(values, n: int, dtype, name: str) -> np.ndarray:
    if values is None:
        return np.zeros(n, dtype=dtype)
    arr = np.asarray(values)
    if arr.ndim == 0:
        arr = np.broadcast_to(arr, (n,))
    if arr.shape != (n,):
        raise ConfigError(f"submit: {name} has shape {arr.shape}, expected ({n},)")
    if arr.dtype.kind not in "iu":
        raise ConfigError(f"submit: {name} must be integers, got dtype {arr.dtype}")
    if arr.dtype.kind == "i" and dtype == np.uint64 and n and int(arr.min()) < 0:
        first = int(np.argmax(arr < 0))
        raise ConfigError(f"submit: row {first}: {name} {int(arr[first])} is negative")
    return np.ascontiguousarray(arr, dtype=dtype)


def xxh3_64(data) -> int:
    """XXH3-64 (seed 0) of a buffer, computed by the engine's own (native) hash."""
    arr = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    return int(_C.xxh3_64(arr))


class Completion:
    """One submitted batch. Thread safe; hold it until you no longer need the bytes' status."""

    __slots__ = ("_native", "sources", "n_rows", "_born")

    def __init__(self, native, n_rows: int, sources: Sequence[str] | None):
        self._native = native
        self.n_rows = n_rows
        self.sources = sources  # the caller's own per-row labels, passed through untouched
        self._born = process.generation()  # a fork()ed child must not wait on it

    def _check_process(self, what: str) -> None:
        """In a fork()ed child a batch of the parent's engine never completes (its reader
        threads stayed there): ForkedError, unless it had finished before the fork."""
        if self._born != process.generation() and not self._native.done():
            raise process.forked_error(what, self._born, "read batch", self._native.path)

    def wait(self, timeout: float | None = None) -> bool:
        """True when every row is read and its copy issued (host copies: done).

        False when ``timeout`` seconds passed first. Raises TierIOError for the
        first failed row only once every sibling row finished or was cancelled
        and the H2D copies already issued have completed (nothing still writes
        into caller memory).
        """
        timeout = settings.timeout("wait: timeout", timeout)
        if self._born != process.generation():
            self._check_process("wait()")  # finished before the fork: its result stands
        elif not self._native.wait(-1.0 if timeout is None else float(timeout)):
            return False
        nb = self._native
        if nb.err:
            raise _io_error(
                nb.path,
                nb.err_row_offset,
                nb.err,
                nb.err_message,
                row=nb.err_row,
                failed_offset=nb.err_offset,
                failed_rows=self.failed_rows,
            )
        return True

    def done(self) -> bool:
        return self._native.done()

    def cancel(self) -> None:
        """Rows not yet started fail with ECANCELED; rows being read finish."""
        self._native.cancel()

    @property
    def failed_rows(self) -> np.ndarray:
        """Caller row indices that failed (sorted); valid once done()."""
        return np.asarray(self._native.failed_rows(), dtype=np.int64)

    def stream_wait(self, stream=None) -> None:
        """Make ``stream`` (torch.cuda.Stream, raw handle, or None = current) wait for the copies.

        Waits on the host for the reads first (wait()), never for the copies.
        """
        self._check_process("stream_wait()")
        self.wait()
        if stream is None:
            import torch

            stream = torch.cuda.current_stream()
        handle = int(getattr(stream, "cuda_stream", stream))
        rc = self._native.stream_wait(handle)
        if rc:
            raise _io_error(
                self._native.path,
                0,
                _errno.EIO,
                f"{self._native.path}: cudaStreamWaitEvent failed (CUDA error {rc})",
            )

    def synchronize(self) -> None:
        """Host waits until the batch's copies have completed, too (then raises like wait())."""
        self._check_process("synchronize()")
        rc = self._native.synchronize()
        self.wait()
        if rc:
            raise _io_error(
                self._native.path,
                0,
                _errno.EIO,
                f"{self._native.path}: cudaEventSynchronize failed (CUDA error {rc})",
            )


class Engine:
    """Reads rows of one file into host memory and copies them to their destinations.

    ``threads`` native readers; ``direct``: "on" requires O_DIRECT (TierIOError
    when the filesystem refuses it), "off" reads buffered, "auto" probes at
    open and falls back to buffered, logging once. With O_DIRECT in use and
    ``probe_cache`` (default), each read first takes what the page cache holds
    without blocking (RWF_NOWAIT) and sends only the rest to O_DIRECT, so the
    page cache stays an opportunistic tier. ``chunk_bytes``: read task
    size; ``chunk_ramp``: a batch's first ``threads`` tasks grow from
    chunk_bytes/threads to chunk_bytes, so the first copy starts after a short
    read; ``stage_bytes`` x ``stage_count``: the pinned staging ring used for
    rows read without a caller buffer. A failed row may leave part of its bytes
    in its destination; the caller must not publish it.

    Memory: every src/dst row must lie inside one buffer registered with this
    engine (``alloc_host`` results, ``register_buffer``, ``registered``), on
    the right side of the bus (tierstore/io/buffers.py); anything else is a
    BufferBoundsError before anything is read, so no length can write past a
    buffer.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        threads: int = 8,
        direct: str = "auto",
        device: str = "cpu",
        device_index: int = 0,
        chunk_bytes: int = 4 << 20,
        stage_bytes: int = 16 << 20,
        stage_count: int = 8,
        probe_cache: bool = True,
        chunk_ramp: bool = True,
    ):
        self.path = os.fspath(path)
        problems = []
        if not isinstance(threads, int) or not 1 <= threads <= 512:
            problems.append(f"threads={threads!r} (expected 1..512)")
        if direct not in _DIRECT_MODES:
            problems.append(f"direct={direct!r} (expected one of {', '.join(_DIRECT_MODES)})")
        if device not in ("cpu", "cuda"):
            problems.append(f"device={device!r} (expected 'cpu' or 'cuda')")
        for name, value in (("chunk_bytes", chunk_bytes), ("stage_bytes", stage_bytes)):
            if not isinstance(value, int) or value < 4096 or value % 4096:
                problems.append(f"{name}={value!r} (expected a positive multiple of 4096)")
        if not isinstance(stage_count, int) or stage_count < 1:
            problems.append(f"stage_count={stage_count!r} (expected >= 1)")
        if problems:
            raise ConfigError(f"Engine({self.path}): invalid " + "; ".join(problems))
        if device == "cuda":
            from tierstore import cuda_available

            if not cuda_available():
                raise ConfigError(
                    f"Engine({self.path}): device='cuda' but no CUDA device "
                    f"(built_with_cuda={bool(_C.built_with_cuda())})"
                )
        self.device = device
        self.device_index = int(device_index)
        self.threads = threads
        try:
            os.close(open_regular(self.path, "pack file"))  # a FIFO would block the native open
        except FileNotFoundError:
            raise TierIOError(self.path, 0, _errno.ENOENT, what="open") from None
        try:
            self._native = _C.NativeEngine(
                self.path,
                threads,
                direct,
                self.device_index if device == "cuda" else -1,
                chunk_bytes,
                stage_bytes,
                stage_count,
                bool(probe_cache),
                bool(chunk_ramp),
            )
        except _C.NativeIOError as exc:
            raise _from_native(exc) from None
        self._buffers = BufferTable(self._native)
        process.track_engine(self)  # closed at exit, refused in a fork()ed child
        reason = self._native.fallback_reason
        if reason and self.path not in _fallback_logged:
            _fallback_logged.add(self.path)
            log.warning("%s", reason)

    # -- properties ---------------------------------------------------------
    @property
    def direct_active(self) -> bool:
        """True when O_DIRECT is in use (after the open-time probe)."""
        return self._native.direct_active

    @property
    def copy_stream(self) -> int:
        """Raw cudaStream_t of the engine's copy stream (0 on a CPU engine)."""
        return self._native.copy_stream

    @property
    def closed(self) -> bool:
        return self._native.closed

    # -- memory ---------------------------------------------------------------
    def alloc_host(self, nbytes: int):
        """A page-aligned torch.uint8 tensor of ``nbytes``; pinned when CUDA is present.

        The tensor keeps the native buffer alive; the memory is freed (and
        unregistered) when the last reference goes.
        """
        import torch

        if not isinstance(nbytes, (int, np.integer)) or nbytes <= 0:
            raise ConfigError(f"alloc_host: nbytes must be a positive int, got {nbytes!r}")
        array, _pinned = _C.alloc_host(int(nbytes), True)
        self._buffers.add(array)  # the tensor keeps the array (and so the entry) alive
        return torch.from_numpy(array)

    def register_buffer(self, buffer) -> None:
        """Make a contiguous torch tensor (host or CUDA) or numpy array known to submit.

        submit accepts only rows inside registered buffers. Held by weak
        reference: it leaves the table when it is freed (or unregister_buffer).
        """
        self._buffers.add(buffer)

    def unregister_buffer(self, buffer) -> None:
        """Drop every registration of ``buffer``."""
        self._buffers.remove(buffer)

    @contextlib.contextmanager
    def registered(self, buffer):
        """``with engine.registered(t):`` ``t`` is registered for the block only (a
        caller-owned buffer used for one batch; nested and concurrent uses of the same
        buffer each hold their own registration)."""
        token = self._buffers.add(buffer)
        try:
            yield buffer
        finally:
            if token:
                self._buffers.remove_token(buffer, token)

    # -- I/O -----------------------------------------------------------------
    def submit(
        self,
        file_offsets,
        lengths,
        src_ptrs=None,
        dst_ptrs=None,
        *,
        dst_device: bool = False,
        sources: Sequence[str] | None = None,
        checksums=None,
        checksum: str = "xxh3_64",
    ) -> Completion:
        """Submit one batch of rows (equal-length integer columns; see the module doc).

        Every row is checked before anything is read (offset >= -1, 0 < length
        <= 2**36, no offset/pointer + length overflow, a source for offset -1):
        a ConfigError naming the row, and nothing is submitted. Then every
        nonzero src (host) and dst (device with ``dst_device``, else host) must
        lie inside one registered buffer (``alloc_host``, ``register_buffer``):
        a BufferBoundsError naming the row, its offset, length and the buffer.

        ``checksums``: optional ``np.uint64[N]``, the expected XXH3-64 (seed 0,
        ``xxhash.xxh3_64_intdigest``; ``checksum="xxh3_64"`` is the only
        algorithm) of each row. Rows read from the file (offset >= 0), of any
        length, are hashed natively in the reader threads as they land: a row is
        cut into segments of at most ``stage_bytes``, each fed to the row's
        streaming XXH3 state in file order by the thread that lands it (a segment
        that lands early waits, holding its stage, until those before it are
        hashed), on the host bytes (the row's src, its host dst, or the staging
        buffer: before the stage is recycled, while the row's H2D chunks are on
        the copy stream). The row is done only once its whole digest was
        compared. A mismatch fails that row with ``errno.EBADMSG`` at its offset
        ("xxh3_64 mismatch (expected .., found ..)"): ``wait()`` raises
        TierIOError with ``row``/``failed_rows`` like any failed read, so a
        caller that publishes only complete batches publishes nothing for it
        (its destination may hold some of the bad bytes). Rows with offset -1
        are not hashed. ``stats()`` counts ``verified_rows``,
        ``verified_bytes`` and ``checksum_failures``.
        """
        if self._native.closed:
            raise ClosedError(f"{self.path}: engine is closed")
        offsets = np.ascontiguousarray(np.asarray(file_offsets), dtype=np.int64).reshape(-1)
        n = offsets.shape[0]
        lens = _column(lengths, n, np.uint64, "lengths")
        src = _column(src_ptrs, n, np.uint64, "src_ptrs")
        dst = _column(dst_ptrs, n, np.uint64, "dst_ptrs")
        if dst_device and self.device != "cuda":
            raise ConfigError(f"submit: dst_device=True on a device='{self.device}' engine")
        if checksum != "xxh3_64":
            raise ConfigError(f"submit: checksum={checksum!r} (expected 'xxh3_64')")
        sums = None if checksums is None else _column(checksums, n, np.uint64, "checksums")
        try:
            native = self._native.submit(offsets, lens, src, dst, bool(dst_device), sums)
        except _C.NativeBoundsError as exc:
            raise BufferBoundsError(f"{self.path}: {exc}") from None
        except ValueError as exc:
            raise ConfigError(f"{self.path}: {str(exc).split(' [')[0]}") from None
        except RuntimeError as exc:
            raise ClosedError(str(exc)) from None
        return Completion(native, n, sources)

    def stats(self) -> dict:
        """Counters since open: per source rows, bytes, latency histogram (log2 us) and p50/p99 (ms)."""
        raw = self._native.stats()
        for name in SOURCES:
            hist = raw[name]["latency_hist_us_log2"]
            raw[name]["p50_ms"] = _hist_quantile(hist, 0.50)
            raw[name]["p99_ms"] = _hist_quantile(hist, 0.99)
        return raw

    def close(self) -> None:
        """Cancel queued rows, finish syscalls in flight, join threads, drain the copy stream."""
        self._native.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _inject_faults(
        self,
        *,
        every_nth: int = 0,
        errno: int = _errno.EIO,
        fail_offset: int = -1,
        short_reads: bool = False,
        delay_us: int = 0,
    ) -> None:
        """Test-only: read through a fault-injecting reader (all defaults: none).

        The native engine then wraps its reader in a FaultyReader
        (csrc/io/include/tierstore/io/faulty_reader.hpp) whose faults act on each
        read attempt (one syscall) of the real reader; the production reader has
        no fault hooks. every_nth: the nth, 2nth, ... attempt fails with
        ``errno``; fail_offset: an attempt covering this file offset fails;
        short_reads: attempts return at most half of what was asked (the read
        loop must still be byte-exact); delay_us: sleep before each attempt
        (keeps reads in flight). An EINTR is retried a bounded number of times
        in a row (16), then the row fails with EINTR. Calling it with no
        arguments switches back to the plain reader.
        """
        self._native.set_faults(every_nth, errno, fail_offset, short_reads, delay_us)


def _hist_quantile(hist: Sequence[int], q: float) -> float:
    """Upper edge (ms) of the log2-microsecond bucket holding quantile q; nan when empty."""
    total = sum(hist)
    if total == 0:
        return math.nan
    rank = q * total
    seen = 0
    for bucket, count in enumerate(hist):
        seen += count
        if seen >= rank:
            return (1 << bucket) / 1000.0
    return (1 << (len(hist) - 1)) / 1000.0

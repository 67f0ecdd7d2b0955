"""Read-side I/O faults for the hostile suite: the cases and the one runner that checks
each of them against a live store.

Faults go through the engine's real fault hook (``Engine._inject_faults``: a
FaultyReader around the real pread / O_DIRECT reader, so the retry and failure paths
are the production ones) or are real: a row's bytes rotted on disk with the file's
mtime put back, so only the sidecar's xxh3 can tell. Every case then checks the same
five things (``check_after``): a TierstoreError of one line naming the pack (and the
row's layer, expert and offset where the fault has one), nothing wrong published
(every pool slot and arena row byte-exact against the pack), no pin left, the worker
idle, and the store serving the same keys once the fault is gone."""

from __future__ import annotations

import errno
import itertools
import os
import warnings
from dataclasses import dataclass

import numpy as np
from store_helpers import assert_store_consistent

from tierstore.errors import TierIOError, TierstoreError

L, E, SLOT = 4, 16, 5000
POOL_SLOTS = 8
ARENA_GB = 8 * 8192 / 2**30  # 8 arena rows
BATCH = 4  # keys per faulted operation
OPS = ("fire", "fire_pipelined", "promote", "load_arena")
VERIFY = ("always", "first", "off")
# A persistent EINTR must surface (bounded retries) like any other errno.
OFFSET_ERRNOS = (errno.EIO, errno.EINTR, errno.ESTALE, errno.ENOMEM)
WHERE = ("first", "mid", "last")  # the byte of the row the failing attempt covers
NTH = (1, 2, 3, 4, 6, 9)
NTH_ERRNOS = (errno.EIO, errno.EINTR)


@dataclass(frozen=True)
class Fault:
    """One injected fault: ``kind`` "offset" (attempts covering row ``row`` of the
    batch at byte ``where`` fail), "nth" (every nth attempt fails), "short" (every
    attempt returns half, plus a small delay) or "rot" (byte ``where`` of row ``row``
    flipped on disk, mtime restored)."""

    kind: str
    op: str
    verify: str
    err: int = 0
    row: int = 0
    where: str = ""
    nth: int = 0
    short: bool = False

    @property
    def name(self) -> str:
        e = errno.errorcode.get(self.err, "")
        return (
            f"{self.kind}-{self.op}-{self.verify}-{e}-r{self.row}{self.where}-n{self.nth}"
            f"{'-short' if self.short else ''}"
        )


def read_cases() -> list[Fault]:
    out = []
    for op, v in itertools.product(OPS, VERIFY):
        for err, row, where in itertools.product(OFFSET_ERRNOS, range(BATCH), WHERE):
            # short reads on every other row: the failing attempt is then mid-row
            out.append(Fault("offset", op, v, err, row, where, short=(row % 2 == 1)))
        for err, nth in itertools.product(NTH_ERRNOS, NTH):
            out.append(Fault("nth", op, v, err, nth=nth))
        out.append(Fault("short", op, v))
        for row, where in itertools.product(range(BATCH), WHERE):
            if v == "always":  # only a checked read can see rot; "off" serves what is there
                out.append(Fault("rot", op, v, errno.EBADMSG, row, where))
    return out


def byte_of(where: str) -> int:
    return {"first": 0, "mid": SLOT // 2, "last": SLOT - 1}[where]


class Rot:
    """Flip one byte of a row in place and put the file's mtime back: bit rot the
    inode check cannot see. ``undo`` restores the byte and the mtime."""

    def __init__(self, pack, offset: int):
        self.path, self.offset = pack.path, offset
        self.st = os.stat(self.path)
        with open(self.path, "r+b") as f:
            f.seek(offset)
            self.old = f.read(1)
            f.seek(offset)
            f.write(bytes([self.old[0] ^ 0x5A]))
        os.utime(self.path, ns=(self.st.st_atime_ns, self.st.st_mtime_ns))

    def undo(self) -> None:
        with open(self.path, "r+b") as f:
            f.seek(self.offset)
            f.write(self.old)
        os.utime(self.path, ns=(self.st.st_atime_ns, self.st.st_mtime_ns))


def cold_keys(store, rng, n: int = BATCH) -> np.ndarray:
    """``n`` (layer, expert) keys resident in neither tier, so the operation reads them."""
    busy = set(map(tuple, store.resident_keys("pool").tolist()))
    busy |= set(map(tuple, store.resident_keys("arena").tolist()))
    free = [(l, e) for l in range(L) for e in range(E) if (l, e) not in busy]
    pick = rng.choice(len(free), size=n, replace=False)
    return np.array([free[i] for i in sorted(pick)], dtype=np.int64)


def run_op(store, op: str, keys: np.ndarray) -> None:
    """One operation over ``keys``, every pin it takes released again (also on failure)."""
    if op in ("fire", "fire_pipelined"):
        fr = store.fire(keys, pipelined=(op == "fire_pipelined"))
        try:
            if fr.pending is not None:
                for layer in sorted(set(keys[:, 0].tolist())):
                    fr.wait_layer(layer)
        finally:
            try:
                store.release(fr)
            except TierIOError:
                pass  # the error a wait_layer raised already, reported once more
    elif op == "promote":
        store.promote(keys).wait(10)
    elif op == "load_arena":
        store.load_arena(keys)
    else:
        raise AssertionError(op)


def inject(store, f: Fault, keys: np.ndarray):
    """Arm fault ``f`` for an operation on ``keys``; returns (undo, the failing key or None)."""
    eng = store.engine
    if f.kind == "offset":
        key = tuple(keys[f.row].tolist())
        eng._inject_faults(
            fail_offset=store.pack.row_offset(*key) + byte_of(f.where), errno=f.err, short_reads=f.short
        )
        return eng._inject_faults, key
    if f.kind == "nth":
        eng._inject_faults(every_nth=f.nth, errno=f.err)
        return eng._inject_faults, None
    if f.kind == "short":
        eng._inject_faults(short_reads=True, delay_us=50)
        return eng._inject_faults, None
    if f.kind == "rot":
        key = tuple(keys[f.row].tolist())
        rot = Rot(store.pack, store.pack.row_offset(*key) + byte_of(f.where))
        return rot.undo, key
    raise AssertionError(f.kind)


def expected_to_fail(f: Fault) -> bool | None:
    """True: the fault must fail the operation; False: must be absorbed; None: either."""
    if f.kind in ("offset", "rot"):
        return True
    if f.kind == "short":
        return False
    if f.err == errno.EINTR:  # a lone EINTR is retried; only every attempt failing fails
        return f.nth == 1
    return True if f.nth == 1 else None


def check_error(exc: BaseException, pack, key, f: Fault) -> None:
    assert isinstance(exc, TierstoreError), f"{type(exc).__name__} is no TierstoreError: {exc}"
    msg = str(exc)
    assert "\n" not in msg and pack.path in msg, f"not one line naming the pack: {msg!r}"
    if isinstance(exc, TierIOError) and f.kind != "nth":
        assert exc.errno == f.err, f"errno {exc.errno}, injected {f.err}: {msg}"
    if key is not None:
        l, e = key
        assert f"layer {l} expert {e}" in msg, f"does not name layer {l} expert {e}: {msg!r}"
        assert f"{pack.row_offset(l, e):#x}" in msg, f"does not name the row's offset: {msg!r}"


def check_after(store, keys: np.ndarray, op: str) -> None:
    """Nothing wrong published, nothing pinned, worker idle; the store still serves."""
    assert store.wait_idle(10), "the worker never went idle"
    assert store.stats().pool.pinned == 0 and store.stats().arena.pinned == 0, "pins leaked"
    assert_store_consistent(store)
    run_op(store, op, keys)  # the same keys, no fault: served
    assert store.wait_idle(10)
    assert store.stats().pool.pinned == 0 and store.stats().arena.pinned == 0
    assert_store_consistent(store)


def run_read_case(store, f: Fault, rng) -> str | None:
    """Run one fault case on ``store``; None when it passed, else what went wrong."""
    keys = cold_keys(store, rng)
    undo, key = inject(store, f, keys)
    raised = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            run_op(store, op=f.op, keys=keys)
    except Exception as exc:  # noqa: BLE001 - judged below
        raised = exc
    finally:
        undo()
    try:
        must = expected_to_fail(f)
        if must is True and raised is None:
            return f"{f.name}: the fault did not fail the {f.op}"
        if must is False and raised is not None:
            return f"{f.name}: an absorbable fault failed the {f.op}: {raised!r}"
        if raised is not None:
            check_error(raised, store.pack, key, f)
        check_after(store, keys, f.op)
    except AssertionError as exc:
        return f"{f.name}: {str(exc).splitlines()[0]}"
    return None

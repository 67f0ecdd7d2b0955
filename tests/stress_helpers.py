"""Harness for the concurrency stress tests (not a test module): guarded threads whose
failures and hangs become test failures with every thread's stack, and the byte check of
every published pool slot and resident arena row against the rows the pack holds."""

from __future__ import annotations

import faulthandler
import os
import sys
import tempfile
import threading
import time

import numpy as np


def stress_seconds(default: float) -> float:
    """STRESS_SECONDS=N turns a bounded CI run into a soak of N seconds (not a TIERSTORE_*
    name: the settings module warns about unknown knobs of its own prefix)."""
    raw = os.environ.get("STRESS_SECONDS", "")
    return float(raw) if raw else default


def all_stacks() -> str:
    """Every thread's Python stack (faulthandler writes to a real fd, not a StringIO)."""
    with tempfile.TemporaryFile("w+") as f:
        faulthandler.dump_traceback(f, all_threads=True)
        f.seek(0)
        return f.read()


class Crew:
    """Threads of one stress round. ``spawn(fn)`` runs fn in a daemon thread; an exception
    is recorded and stops the crew. ``join(timeout)`` fails with all stacks when a thread
    is still alive: a hang is a failure, never a stuck suite."""

    def __init__(self):
        self.stop = threading.Event()
        self.errors: list[tuple[str, BaseException]] = []
        self.threads: list[threading.Thread] = []

    def spawn(self, fn, *args, name=None) -> threading.Thread:
        def run():
            try:
                fn(*args)
            except BaseException as exc:  # noqa: BLE001 - reported by join()
                self.errors.append((threading.current_thread().name, exc))
                self.stop.set()

        t = threading.Thread(target=run, name=name or fn.__name__, daemon=True)
        self.threads.append(t)
        t.start()
        return t

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self.threads if t.is_alive()]
        if alive:
            stacks = all_stacks()
            sys.stderr.write(stacks)
            raise AssertionError(
                f"threads {alive} still running {timeout:.0f} s after the round ended (a hang):\n{stacks}"
            )
        if self.errors:
            name, exc = self.errors[0]
            raise AssertionError(f"thread {name} failed: {exc!r}") from exc


def wait_ticket(ticket, timeout: float = 30.0, closed_ok=()) -> bool:
    """A ticket must finish within ``timeout``: True (done), False (refused with one of
    ``closed_ok``); a timeout is an AssertionError, never a hang."""
    try:
        ok = ticket.wait(timeout)
    except closed_ok:
        return False
    assert ok, f"ticket of {ticket.requested} keys did not finish in {timeout} s"
    return True


def check_published_bytes(store, rows: np.ndarray) -> int:
    """Every published pool slot and resident arena row holds exactly ``rows[key]``
    (rows: uint8 [L * E, slot_bytes], the pack's rows when the store opened it).
    Returns how many rows were compared. Works on a closed store too (tables stay)."""
    with store.lock:  # a consistent snapshot: the worker may still be publishing
        return _check_published_bytes(store, rows)


def _check_published_bytes(store, rows):
    pool, arena = store.tier("pool"), store.tier("arena")
    table = pool.device_table()
    resident = pool.resident_slot()
    pool_bytes = store.pool.cpu().numpy() if store.pool.is_cuda else store.pool.clone().numpy()
    n = 0
    for key in np.flatnonzero(table >= 0).tolist():
        slot = int(table[key])
        assert resident[key] == slot, f"slot {slot} of key {key} published, not RESIDENT"
        got = pool_bytes[slot, : rows.shape[1]]
        if not np.array_equal(got, rows[key]):
            bad = int(np.count_nonzero(got != rows[key]))
            raise AssertionError(
                f"pool slot {slot} (key {key}): {bad} of {rows.shape[1]} "
                f"bytes differ from the pack (torn or wrong row)"
            )
        n += 1
    arena_rows = arena.resident_slot()
    for key in np.flatnonzero(arena_rows >= 0).tolist():
        row = int(arena_rows[key])
        assert np.array_equal(arena.row_bytes(row)[: rows.shape[1]], rows[key]), (
            f"arena row {row} (key {key}) differs from the pack"
        )
        n += 1
    return n


def try_rewrite(pack_path: str, layer: int, rows: np.ndarray) -> bool:
    """Rewrite ``layer`` of the pack in place with PackWriter (its own identity read from
    the sidecar). False when the writer is refused (PackBusyError: a live store)."""
    from tierstore.format import Pack, PackBusyError, PackWriter

    with Pack.open(pack_path) as p:
        ident = dict(
            tag=p.tag,
            n_layers=p.n_layers,
            n_experts=p.n_experts,
            slot_bytes=p.slot_bytes,
            ckpt_id=p.ckpt_id,
            quantizer_abi=p.sidecar.quantizer_abi,
        )
    try:
        with PackWriter(pack_path, **ident) as w:
            w.write_layer(layer, rows)
    except PackBusyError:
        return False
    return True


def open_fds() -> set[str]:
    """This process's open fds and what they name (a leak shows as a new pack path)."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return out


def leaked_pack_fds(pack_path: str) -> list[str]:
    """fds still naming ``pack_path`` (or its sidecar / lock)."""
    base = os.path.realpath(pack_path)
    return [p for p in open_fds() if p.startswith(base[: -len(".pack")])]


__all__ = [
    "Crew",
    "all_stacks",
    "check_published_bytes",
    "leaked_pack_fds",
    "open_fds",
    "stress_seconds",
    "try_rewrite",
    "wait_ticket",
]

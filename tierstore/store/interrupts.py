"""Sections a Ctrl-C must not leave half done, without touching anyone's signal handlers.

The store lives inside someone else's process: the engine installs its own SIGINT and
SIGTERM handlers, and a library that swapped them on every fire (as this module once
did) would fight it. So nothing here calls ``signal.signal``. Instead, the few places
that write several tables that must agree (a batch's publish, its rollback, a pipelined
layer's publish) are *sections of steps* on the store's journal:

* ``Journal.run(steps)`` records the section as open, runs its steps in order and
  records each one done in the same statement that calls it (``_do``), so a
  KeyboardInterrupt (raised in the main thread, between statements or at a call) can
  never fall between a step's last effect and its record;
* every statement of a step but its last is idempotent (setting a state, a mask, a
  table entry), so a step cut anywhere can simply be run again;
* an interrupted section is rolled forward at once, before the KeyboardInterrupt leaves
  the call; if a second Ctrl-C cuts that too, the section stays open and the next call
  into the store (``drain``: every public call, ``close()`` included) finishes it.

Pins follow one more rule: a fire's result is registered before it pins anything
(``OrphanPins.adopt``), its pinned keys live in a ``PinHolder`` the result shares with
the store, and a result dropped without ``release`` (a Ctrl-C between the fire and its
caller, an exception in the caller) hands its keys and any batch in flight back at the
next fire, step or stats call.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

_EMPTY = np.empty(0, dtype=np.int64)


def _do(steps, i): steps[i](); return i + 1  # noqa: E702 - one line: the step and its record are one  # fmt: skip


class Section:
    """Steps of one multi-table write; ``next`` is the first step not done. ``undo``: the
    steps that take it back when its caller was interrupted (a reservation no one will
    use); they run after the section was finished, so they always undo all of it."""

    __slots__ = ("steps", "next", "undo")

    def __init__(self, steps, undo=None):
        self.steps, self.next = tuple(steps), 0
        self.undo = None if undo is None else Section(undo)

    def finish(self) -> None:
        steps = self.steps
        while self.next < len(steps):
            self.next = _do(steps, self.next)

    def finish_interrupted(self) -> None:
        """The caller was interrupted: the section done, then its undo."""
        self.finish()
        if self.undo is not None:
            self.undo.finish()


class Journal:
    """A store's open sections. A section runs under the store lock (taken here, an
    RLock: the caller may hold it already), so ``drain`` from another thread waits for a
    section in progress instead of running it twice. A section is open only while it
    runs, or after an interrupt cut its caller short: ``drain`` finishes those (and
    their undo)."""

    def __init__(self, lock):
        self.lock = lock
        self.open: list[Section] = []  # list.append / remove: atomic

    def run(self, *steps, undo=None) -> None:
        section = Section(steps, undo)
        with self.lock:
            try:
                self.open.append(section)
                section.finish()
            except (KeyboardInterrupt, SystemExit):
                section.finish_interrupted()  # a second Ctrl-C here: drain() goes on
                _discard(self.open, section)
                raise
            except BaseException:
                _discard(self.open, section)  # a step's own error: not retried forever
                raise
            _discard(self.open, section)

    def drain(self) -> int:
        """Finish every section an interrupt left open; how many."""
        if not self.open:
            return 0
        n = 0
        with self.lock:
            for section in list(self.open):
                try:
                    section.finish_interrupted()
                except (KeyboardInterrupt, SystemExit):
                    raise  # still open: the next call goes on
                except BaseException:
                    _discard(self.open, section)
                    raise
                _discard(self.open, section)
                n += 1
        return n


def _discard(items: list, item) -> None:
    try:
        items.remove(item)
    except ValueError:
        pass


class PinHolder:
    """The keys a fire result holds pinned, shared with its finalizer (see the module
    doc). ``keys`` is replaced, never mutated: a reader sees one whole array. ``load`` is
    a weak reference to the result's pipelined batch: a strong one would keep the result
    alive through the batch's error (its traceback holds the caller's frame)."""

    __slots__ = ("keys", "load", "stream", "__weakref__")

    def __init__(self):
        self.keys, self.load, self.stream = _EMPTY, None, None


class OrphanPins:
    """Pins (and pipelined batches) of fire results dropped without ``release``."""

    def __init__(self):
        self._dropped: list = []  # list.append / pop: atomic; the finalizer may run anywhere

    def adopt(self, result) -> PinHolder:
        """Register ``result`` before it pins anything; returns its holder."""
        holder = PinHolder()
        result.holder = holder
        result.guard = weakref.finalize(result, self._dropped.append, holder)
        return holder

    @staticmethod
    def disown(result) -> None:
        """The result is being released: its pins are the caller's business again."""
        if result.guard is not None:
            result.guard.detach()
            result.guard = None

    def drain(self, lock, pool, settle: bool = True) -> int:
        """Settle what dropped results left in flight, then unpin their keys; keys unpinned.
        Called WITHOUT ``lock`` held when ``settle``: settling waits for reads and for other
        threads that publish or roll back the same batch under that lock. Without
        ``settle`` (stats(), which a poolmon snapshot calls under the lock) a result whose
        batch is still in flight stays queued for the next fire or step."""
        n, later = 0, []
        while self._dropped:
            holder = self._dropped.pop()
            load = None if holder.load is None else holder.load()
            if load is not None and not load.batch.done.is_set():
                if not settle:
                    later.append(holder)
                    continue
                load.settle(holder.stream)  # never raises; a failed layer is rolled back
            n += release_pins(lock, pool, holder)
        self._dropped.extend(later)
        return n


def release_pins(lock, pool, holder: PinHolder) -> int:
    """Unpin ``holder``'s keys once: the unpin and the holder's emptying are one step."""
    with lock:
        keys = holder.keys
        holder.keys = _unpinned(pool, keys)
    return len(keys)


def _unpinned(pool, keys): pool.unpin(keys); return _EMPTY  # noqa: E702 - one line: see _do  # fmt: skip


def take_pins(lock, pool, holder: PinHolder, keys: np.ndarray) -> None:
    """Pin ``keys`` (unique) for ``holder``: the pin and the holder's record are one step."""
    with lock:
        holder.keys = _pinned(pool, keys)


def _pinned(pool, keys): pool.pin(keys); return keys  # noqa: E702 - one line: see _do  # fmt: skip


def drop_pins(lock, pool, holder: PinHolder, gone: np.ndarray) -> None:
    """Unpin the ``gone`` subset of ``holder``'s keys (a fire giving up keys)."""
    if not len(gone):
        return
    with lock:
        keys = holder.keys
        keep = keys[~np.isin(keys, gone)]
        holder.keys = _unpinned_some(pool, keys[np.isin(keys, gone)], keep)


def _unpinned_some(pool, gone, keep): pool.unpin(gone); return keep  # noqa: E702 - see _do  # fmt: skip


def on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()

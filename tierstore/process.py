"""A library inside someone else's process: the objects that own threads (stores and
engines) when that process exits or forks.

Exit. An atexit hook closes every live store, then every live engine: their worker and
native reader threads are joined while the interpreter can still run them (atexit runs
after the caller's non-daemon threads were joined, before finalization). Without it a
store's daemon worker, blocked in a native wait when finalization began, was ended by
CPython inside that call and the process aborted ("terminate called without an active
exception", 7-8 exits in 10 with promotions in flight). At exit a promotion still queued
finishes its ticket with ClosedError and the running one completes (one batch). A
caller's own daemon thread that comes back from a native wait after finalization began is
parked there instead of aborting the process (csrc/python/gil.hpp).

Fork. A fork()ed child has none of the parent's threads: a store or engine it inherited
would wait for them forever (fire, close, a ticket), and freeing it at the child's exit
would join threads that do not exist. In the child (``os.register_at_fork``) each
inherited one is switched to a refusing twin of its class: every public method raises
ForkedError naming the parent's pid (open a new store in the child), ``close()`` does
nothing, and the object is kept for the child's lifetime (never freed, so nothing is
joined). A ticket or completion made in the parent refuses to wait in the child unless it
had already finished. The parent is untouched: nothing runs there at fork, and its hot
path pays one integer compare per wait.
"""

from __future__ import annotations

import atexit
import inspect
import logging
import os
import weakref

from tierstore.errors import ForkedError

log = logging.getLogger("tierstore.process")

_stores: weakref.WeakSet = weakref.WeakSet()  # closed first at exit
_engines: weakref.WeakSet = weakref.WeakSet()  # then the engines (a store's may be shared)
_pids = [os.getpid()]  # _pids[g]: the process of fork generation g (0: the first one)
_twins: dict[type, type] = {}


def generation() -> int:
    """How many fork()s lie between the first process that imported tierstore and this
    one: an object made at generation g belongs to process ``_pids[g]``."""
    return len(_pids) - 1


def track_store(store) -> None:
    """Close ``store`` at exit and refuse it in a fork()ed child."""
    _stores.add(store)


def track_engine(engine) -> None:
    _engines.add(engine)


def forked_error(what: str, born: int, kind: str, path: str | None = None) -> ForkedError:
    """``what`` on an object of ``kind`` made in generation ``born``, called in a child."""
    head = f"{path}: " if path else ""
    return ForkedError(
        f"{head}{what} in pid {os.getpid()}: this {kind} was opened in pid "
        f"{_pids[born]} and a fork()ed child cannot use it (the threads that "
        f"run it stayed in that process): open a new ExpertStore in the child"
    )


def check_not_inherited(born: int, what: str, kind: str, path: str | None = None) -> None:
    """Raise ForkedError when an object of generation ``born`` is waited on in a child."""
    if born != len(_pids) - 1:
        raise forked_error(what, born, kind, path)


def _snapshot(group: weakref.WeakSet) -> list:
    while True:  # another thread may add while we copy: retry (never more than a few times)
        try:
            return list(group)
        except RuntimeError:
            continue


def _path_of(obj) -> str | None:
    path = getattr(obj, "path", None)
    if path is None:
        path = getattr(getattr(obj, "pack", None), "path", None)
    return path


def _refusing_twin(cls: type) -> type:
    """A subclass of ``cls`` whose public methods raise ForkedError and whose close()
    (and finalizer) do nothing; made once per class, only ever in a child."""
    twin = _twins.get(cls)
    if twin is not None:
        return twin

    def refuse(name):
        def method(self, *args, **kwargs):
            raise forked_error(f"{name}()", self._forked_born, type(self).__mro__[1].__name__, _path_of(self))

        method.__name__ = name
        return method

    names = [
        name
        for name, _ in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_") and name != "close"
    ]
    namespace = {name: refuse(name) for name in names}
    namespace.update(
        close=lambda self: None,
        __del__=lambda self: None,
        __exit__=lambda self, *exc: None,
        __module__=cls.__module__,
    )
    twin = type(f"Inherited{cls.__name__}", (cls,), namespace)
    _twins[cls] = twin
    return twin


def _inherit(obj, born: int) -> None:
    """Make ``obj`` (a store or engine of the parent) inert in this child, for good."""
    from tierstore import _C

    hook = getattr(obj, "_after_fork_in_child", None)
    if hook is not None:
        hook()
    obj._forked_born = born
    obj.__class__ = _refusing_twin(type(obj))
    _C.keep_forever(obj)  # never freed here: its native threads live in the parent


def _after_fork_in_child() -> None:
    born = len(_pids) - 1
    _pids.append(os.getpid())
    for group in (_stores, _engines):
        for obj in _snapshot(group):
            group.discard(obj)
            try:
                _inherit(obj, born)
            except Exception as exc:  # noqa: BLE001 - a fork must never fail in the child
                log.warning("fork: could not retire an inherited %s: %s", type(obj).__name__, exc)


def _close_all_at_exit() -> None:
    try:
        from tierstore import _C

        _C.mark_exit_thread()  # finalization runs on this thread (gil.hpp)
    except ImportError:  # pragma: no cover - the native core is always built
        pass
    for group in (_stores, _engines):
        for obj in _snapshot(group):
            try:
                obj.close()
            except Exception as exc:  # noqa: BLE001 - exit goes on for the others
                log.warning("closing %r at exit failed: %s", obj, exc)


atexit.register(_close_all_at_exit)
os.register_at_fork(after_in_child=_after_fork_in_child)

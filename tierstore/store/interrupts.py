"""Critical sections that a Ctrl-C must not split.

Publishing a batch writes several tables that must agree (the device slot table, its host
mirror, slot states, arena rows, pins). A KeyboardInterrupt landing between two of those
writes would leave them apart: slots published on the device but not in the mirror, arena
rows LOADING forever. ``no_interrupts()`` defers SIGINT (and SIGTERM) for the few
microseconds of such a section when it runs on the main thread (the only thread Python
delivers signals to) and re-raises the deferred signal's exception once the tables agree.
Other threads need nothing: signals never interrupt them.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

_DEFERRED = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def no_interrupts() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[tuple[int, object]] = []
    previous = {}
    for sig in _DEFERRED:
        old = signal.getsignal(sig)
        if callable(old) or old == signal.default_int_handler:
            previous[sig] = old
            signal.signal(sig, lambda s, f: caught.append((s, f)))
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        for sig, frame in caught:      # now that the section is whole, deliver them
            handler = previous[sig]
            if callable(handler):
                handler(sig, frame)

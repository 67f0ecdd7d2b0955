"""Real processes for tests/store/test_process.py: ``python tests/process_scenarios.py SCENARIO PACK``.

A store over PACK with promotions in flight (every read slowed by the engine's fault hook,
so the worker is inside a native wait), then (fork-*: while a thread of the parent fires
in a loop):

* ``exit-return`` / ``exit-raise`` / ``exit-sysexit``: the script ends by returning,
  by an exception escaping it, or by ``sys.exit(3)``, without closing the store;
* ``exit-dropped``: the last reference is dropped unclosed, then the script returns;
* ``exit-daemon``: a daemon thread of the caller's fires in a loop while the script returns;
* ``fork-use``: ``os.fork()``; the child calls the inherited store (every call must raise
  ForkedError at once, ``close()`` must return) and exits through a normal interpreter
  exit; the parent then serves on. Prints one JSON line: the child's findings, its exit
  status (or "hang"), and the parent's;
* ``fork-idle``: the child makes no call on the store; its main returns through the
  ``with store:`` block the fork happened in (JSON as above).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import numpy as np

import tierstore as ts
from tierstore.testing.packs import random_layer_rows

CHILD_DEADLINE_S = 20.0


def open_busy_store(path: str):
    store = ts.ExpertStore(path, vram_slots=64, ram_gb=0.0, device="cpu", threads=2, lazy_per_step=0)
    store.engine._inject_faults(delay_us=3000)  # every read attempt sleeps: reads stay in flight
    L, E = store.pack.n_layers, store.pack.n_experts
    tickets = [store.promote([(layer, e) for e in range(E)]) for layer in range(L)]
    time.sleep(0.05)  # the worker is inside its first batch's native wait
    return store, tickets


def _outcome(fn) -> dict:
    t0 = time.monotonic()
    try:
        value = fn()
        res = {"outcome": "returned", "value": repr(value)}
    except Exception as exc:  # noqa: BLE001 - reported to the test
        res = {
            "outcome": "raised",
            "etype": type(exc).__name__,
            "mro": [c.__name__ for c in type(exc).__mro__],
            "msg": str(exc),
        }
    res["elapsed"] = time.monotonic() - t0
    return res


def _child_calls(store, tickets) -> dict:
    E = store.pack.n_experts
    return {
        "fire": _outcome(lambda: store.fire([(0, 0), (1, 1)])),
        "promote": _outcome(lambda: store.promote([(0, 2)])),
        "ticket": _outcome(lambda: tickets[-1].wait(timeout=5)),
        "record": _outcome(lambda: store.record(0, np.array([[1, 2]]))),
        "step": _outcome(store.step),
        "stats": _outcome(store.stats),
        "release": _outcome(lambda: store.release(None)),
        "load_arena": _outcome(lambda: store.load_arena([(0, E - 1)])),
        "submit": _outcome(lambda: store.engine.submit([0], [4096])),
        "close": _outcome(store.close),
        "close_again": _outcome(store.close),
    }


def _wait_child(pid: int) -> str:
    deadline = time.monotonic() + CHILD_DEADLINE_S
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return f"exit {os.waitstatus_to_exitcode(status)}"
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return "hang"


def _parent_serves(store, tickets) -> dict:
    """After the child: the parent's tickets complete and a fire serves the exact bytes."""
    finished = all(t.wait(timeout=60) for t in tickets)
    store.engine._inject_faults()
    keys = [(1, 3), (0, 5)]
    fr = store.fire(keys)
    table = store.slot_table.numpy()
    ok = all(
        np.array_equal(
            store.pool[int(table[layer, e])].numpy()[: store.pack.slot_bytes],
            random_layer_rows(1, layer, store.pack.n_experts, store.pack.slot_bytes)[e],
        )
        for layer, e in keys
    )
    store.release(fr)
    store.check_invariants(idle=True)
    store.close()
    return {"bytes_ok": ok, "tickets_finished": finished}


def _fire_until(store, stop: threading.Event) -> None:
    """The parent's forward thread: evict and fire in a loop (a fire's reads are in flight
    most of the time, so the fork lands inside one)."""
    keys = [(0, 7), (1, 9)]
    while not stop.is_set():
        store.evict(keys)
        store.release(store.fire(keys))


def fork_scenario(path: str, touch: bool) -> None:
    store, tickets = open_busy_store(path)
    stop = threading.Event()
    forward = threading.Thread(target=_fire_until, args=(store, stop), daemon=True)
    forward.start()
    time.sleep(0.05)
    findings = os.path.join(os.path.dirname(path), f"child-{os.getpid()}.json")
    with store:  # the child leaves this block too: its exit closes the inherited store
        pid = os.fork()
        if pid == 0:  # the child: a normal interpreter exit at the end (atexit, finalizers)
            res = {"pid": os.getpid(), "parent": os.getppid()}
            if touch:
                res.update(_child_calls(store, tickets))
            with open(findings, "w") as f:
                json.dump(res, f)
            if touch:
                sys.exit(0)
            return  # fork-idle: main returns through the with block
        child_status = _wait_child(pid)
        stop.set()
        forward.join()
        child = {}
        if os.path.exists(findings):
            with open(findings) as f:
                child = json.load(f)
            os.unlink(findings)
        parent = _parent_serves(store, tickets)
    print(
        json.dumps(
            {"child_status": child_status, "child": child, "parent_pid": os.getpid(), "parent": parent}
        )
    )


def main(scenario: str, path: str) -> None:
    if scenario.startswith("fork-"):
        return fork_scenario(path, touch=scenario == "fork-use")
    store, tickets = open_busy_store(path)
    if scenario == "exit-raise":
        raise RuntimeError("an error escaping main with promotions in flight")
    if scenario == "exit-sysexit":
        sys.exit(3)
    if scenario == "exit-dropped":
        del store, tickets
    if scenario == "exit-daemon":

        def fire_forever():
            while True:
                try:
                    store.release(store.fire([(0, 1), (1, 2)]))
                except ts.ClosedError:  # closed at exit: the caller's loop ends
                    return

        threading.Thread(target=fire_forever, daemon=True).start()
        time.sleep(0.05)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

"""A second Ctrl-C while the first is still being handled: inside SettleFirst's own
settle of a watched pipelined batch, or inside close()'s settle of a batch left in
flight (store/interrupts.py). Neither may deadlock, leave a batch in flight, leak a pin
or the activity count, or leave SIGINT's handler changed.

Each case runs in a child process (tests/interrupt_reentry_child.py) under a timeout:
a deadlock is a hang, and a hang in this process would stop the whole run. The child itself dumps its stacks
and exits when one run takes over 60 s (faulthandler), so a deadlock is reported with
where it is, long before the parent's generous timeout (a loaded CI machine)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

CHILD = os.path.join(os.path.dirname(__file__), "interrupt_reentry_child.py")
GAPS = ("1", "2", "4", "8", "16")


@pytest.mark.parametrize("how", ["wait", "close"])
def test_a_second_ctrl_c_during_the_first_ones_settle_never_deadlocks(tmp_path, how):
    try:
        done = subprocess.run([sys.executable, CHILD, str(tmp_path), how, *GAPS],
                              capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"deadlock: two SIGINTs ({how}) hung the child past {exc.timeout} s")
    assert done.returncode == 0, done.stderr[-3000:]
    counts = dict(re.findall(r"(\w+)=(\d+)", done.stdout))
    assert int(counts["interrupted"]) > 50, done.stdout
    # the cases this file is for happened: a SIGINT came while SettleFirst's handler
    # ran (the first one's settle), or while close() ran
    assert int(counts["reentered"]) > 0, done.stdout
    if how == "close":
        assert int(counts["in_close"]) > 0, done.stdout


def test_a_batch_settled_by_another_thread_gives_sigints_handler_back_at_the_owners_wait(
        tmp_path):
    """The owner's fire left SettleFirst installed (its batch was in flight); a close()
    on another thread settles the batch; the owner's next wait_layer, which has nothing
    to wait for, takes SettleFirst off: no section need end for the handler to be
    Python's own again, and the settled batch leaves the watch list."""
    import signal
    import threading

    import tierstore as ts
    from tierstore.store import interrupts
    from tierstore.testing.packs import make_random_pack

    pack = make_random_pack(tmp_path, 3, 16, 3000, seed=8)
    store = ts.ExpertStore(pack, vram_slots=8, device="cpu", lazy_per_step=0)
    fr = store.fire([(0, 1), (1, 2), (2, 3)], pipelined=True)
    load = fr.pending
    installed = signal.getsignal(signal.SIGINT)
    closer = threading.Thread(target=store.close)
    closer.start()
    closer.join(20)
    assert not closer.is_alive()
    assert load.batch.done.is_set()
    if not isinstance(installed, interrupts.SettleFirst):
        pytest.skip("the batch landed before the fire's section ended: nothing to unwrap")
    assert signal.getsignal(signal.SIGINT) is installed      # nothing on main ran since
    fr.wait_layer(0)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert load not in set(interrupts._WATCHED)


_HELD_EVENT_CHILD = r'''
import signal, sys, tempfile
import tierstore as ts
from tierstore.store.interrupts import SettleFirst
from tierstore.testing.packs import make_random_pack
pack = make_random_pack(tempfile.mkdtemp(), 3, 16, 3000, seed=9)
store = ts.ExpertStore(pack, vram_slots=8, device="cpu", lazy_per_step=0)
for attempt in range(200):
    fr = store.fire([(0, attempt % 16), (1, 2), (2, 3)], pipelined=True)
    if isinstance(signal.getsignal(signal.SIGINT), SettleFirst):
        break
    store.release(fr)
    store.evict([(l, e) for l in range(3) for e in range(16)])
else:
    print("never in flight"); sys.exit(0)
event = fr.pending.batch.done
try:
    with event._cond:                       # as inside this thread's own done.wait()/set()
        signal.raise_signal(signal.SIGINT)  # SettleFirst runs here, on this thread
    sys.exit("no KeyboardInterrupt")
except KeyboardInterrupt:
    pass
fr.wait_all()                               # the batch was left to its owner: it settles
store.release(fr)
assert not store._mover.inflight and not store._pool.key_pins.any()
store.close()
print("ok")
'''


def test_a_ctrl_c_inside_the_batchs_own_event_is_left_to_the_owner_not_deadlocked():
    """SettleFirst skips a batch whose Event lock is taken (the signal may have come inside
    this thread's own wait()/set() of it: settling would take that plain Lock again and
    hang); the KeyboardInterrupt is raised at once and the owner's wait settles it."""
    try:
        done = subprocess.run([sys.executable, "-c", _HELD_EVENT_CHILD], capture_output=True,
                              text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("deadlock: SettleFirst waited on the Event lock its own thread held")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() in ("ok", "never in flight"), done.stdout
    if done.stdout.strip() != "ok":
        pytest.skip("no fire stayed in flight past its section on this machine")

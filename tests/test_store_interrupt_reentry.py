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

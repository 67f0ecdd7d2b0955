"""Never a wrong byte, never a hang: rows checked against the sidecar's xxh3 as they
land, a pack replaced or rewritten under the store refused, FIFOs and other non-regular
files refused without blocking, headers that would need unbounded memory refused, and
bad arguments answered with a TierstoreError."""

from __future__ import annotations

import math
import os
import threading
import warnings

import numpy as np
import pytest
from cli_process import child_env
from store_helpers import assert_store_consistent
from store_helpers import corrupt_in_place as _corrupt_in_place

import tierstore as ts
from tierstore import settings
from tierstore.format import Pack
from tierstore.store.pool import SlotPool
from tierstore.testing.packs import make_random_pack, random_layer_rows

L, E, SLOT = 3, 16, 5000


@pytest.fixture
def pack(tmp_path):
    return make_random_pack(tmp_path, L, E, SLOT, seed=4)


def _run_with_timeout(fn, seconds=20):
    """Run fn in a thread; fail (instead of hanging the suite) if it does not return."""
    out = {}

    def go():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            out["error"] = exc

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{fn} blocked for more than {seconds} s"
    if "error" in out:
        raise out["error"]
    return out.get("value")


# -- checksums on load ------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["always", "first"])
def test_row_corrupted_in_place_is_refused_and_nothing_is_published(pack, device, mode):
    _corrupt_in_place(pack, 1, 5)
    with ts.ExpertStore(pack, vram_slots=8, ram_gb=0, device=device, verify=mode, lazy_per_step=0) as store:
        with pytest.raises(ts.TierIOError, match=r"layer 1 expert 5.*(xxh3|EBADMSG|mismatch)"):
            store.fire([(1, 4), (1, 5)])
        table = store.slot_table.cpu().numpy()
        assert table[1, 5] == -1 and table[1, 4] == -1  # the whole batch is unpublished
        fr = store.fire([(0, 3), (2, 9)])  # intact rows still load
        assert_store_consistent(store)
        store.release(fr)


def test_verify_off_serves_the_bytes_on_disk(pack):
    _corrupt_in_place(pack, 2, 2)
    with ts.ExpertStore(pack, vram_slots=4, device="cpu", verify="off") as store:
        store.release(store.fire([(2, 2)]))
        slot = int(store.slot_table[2, 2])
        assert not np.array_equal(store.pool[slot].numpy()[:SLOT], random_layer_rows(4, 2, E, SLOT)[2])


@pytest.mark.parametrize("mode", [None, "first", "always"], ids=["default", "first", "always"])
@pytest.mark.parametrize("op", ["fire", "pipelined", "promote"])
def test_a_row_rotted_after_its_first_read_is_refused_when_read_again(pack, mode, op):
    """Every read that leaves the disk or page cache is hashed, not only a row's first:
    a byte flipped on disk after the row was served (mtime put back), then an eviction,
    then a re-read: refused, nothing published, and the store serves on ("first", the old
    mode that published such a re-read unchecked, is now a spelling of "always")."""
    kw = {} if mode is None else {"verify": mode}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        store = ts.ExpertStore(pack, vram_slots=4, ram_gb=0, device="cpu", lazy_per_step=0, **kw)
    with store:
        keys = [(1, 4), (1, 5)]
        store.release(store.fire(keys))  # the first read: hashed, intact
        assert store.engine.stats()["verified_rows"] == 2
        assert store.evict(keys) == 2
        _corrupt_in_place(pack, 1, 5)
        with pytest.raises(ts.TierIOError, match=r"layer 1 expert 5 .*xxh3_64 mismatch") as ei:
            if op == "fire":
                store.fire(keys)
            elif op == "pipelined":
                fr = store.fire(keys, pipelined=True)
                try:
                    fr.wait_layer(1)
                finally:
                    store.release(fr)
            else:
                store.promote(keys).wait(timeout=20)
        assert pack.path in str(ei.value) and "\n" not in str(ei.value)
        assert store.wait_idle(20)
        table = store.slot_table.cpu().numpy()
        assert table[1, 5] == -1 and table[1, 4] == -1  # nothing of the batch published
        fr = store.fire([(1, 4), (0, 3)])  # the intact rows serve on
        for layer, e in ((1, 4), (0, 3)):
            slot = int(store.slot_table[layer, e])
            assert np.array_equal(store.pool[slot].numpy()[:SLOT], random_layer_rows(4, layer, E, SLOT)[e])
        store.release(fr)
        store.check_invariants(idle=True)


def test_verify_first_is_always_with_a_warning(pack):
    with pytest.warns(FutureWarning, match="'first' now verifies every read"):
        store = ts.ExpertStore(pack, vram_slots=2, device="cpu", verify="first")
    with store:
        assert store.verifier.mode == "always" and store.config.verify == "always"
    with pytest.warns(FutureWarning), settings.override(verify="first"):
        assert settings.get("verify") == "always"


def test_verify_mode_is_validated_with_its_name(pack):
    with pytest.raises(
        ts.ConfigError,
        match="verify='sometimes': unknown verify mode 'sometimes'; expected one of always, off",
    ):
        ts.ExpertStore(pack, vram_slots=2, device="cpu", verify="sometimes")
    with pytest.raises(ts.ConfigError, match="TIERSTORE_VERIFY"):
        settings.check_environment({"TIERSTORE_VERIFY": "maybe"})


# -- the very file Pack.open validated ----------------------------------------------------
def test_pack_replaced_before_the_store_opens_is_refused(tmp_path, pack):
    other = make_random_pack(tmp_path / "other", L, E, SLOT, seed=99)
    os.replace(other.path, pack.path)  # same name, another file
    with pytest.raises(ts.FormatError, match="replaced since Pack.open"):
        ts.ExpertStore(pack, vram_slots=4, device="cpu")


def test_pack_rewritten_under_a_live_store_is_refused_not_served(pack):
    with ts.ExpertStore(pack, vram_slots=4, ram_gb=0, device="cpu", verify="off", lazy_per_step=0) as store:
        store.release(store.fire([(0, 0)]))
        fd = os.open(pack.path, os.O_WRONLY)
        os.pwrite(fd, b"\x00" * 64, pack.row_offset(1, 1))
        os.close(fd)
        os.utime(pack.path)  # a writer leaves a new mtime
        with pytest.raises(ts.FormatError, match="modified since Pack.open"):
            store.fire([(1, 1)])
        assert int(store.slot_table[1, 1]) == -1
        assert_store_consistent_skip_modified(store)


def assert_store_consistent_skip_modified(store):
    store.check_invariants()  # bookkeeping is whole even though the file changed


# -- FIFOs and other non-regular files never block ------------------------------------------
def test_fifo_as_pack_file_is_refused_without_blocking(tmp_path, pack):
    side = pack.sidecar_path
    fifo_dir = tmp_path / "f"
    fifo_dir.mkdir()
    target = fifo_dir / os.path.basename(pack.path)
    os.mkfifo(target)
    (fifo_dir / os.path.basename(side)).write_bytes(open(side, "rb").read())
    with pytest.raises(ts.FormatError, match="not a regular file .*FIFO"):
        _run_with_timeout(lambda: Pack.open(target))


def test_fifo_as_sidecar_is_refused_without_blocking(tmp_path, pack):
    fifo_dir = tmp_path / "s"
    fifo_dir.mkdir()
    os.link(pack.path, fifo_dir / os.path.basename(pack.path))
    os.mkfifo(fifo_dir / os.path.basename(pack.sidecar_path))
    with pytest.raises(ts.FormatError, match="FIFO"):
        _run_with_timeout(lambda: Pack.open(fifo_dir / os.path.basename(pack.path)))


def test_fifo_as_warm_start_is_a_warning_and_a_cold_start(tmp_path, pack):
    fifo = tmp_path / "poolmon.json"
    os.mkfifo(fifo)
    with pytest.warns(UserWarning, match="FIFO"):
        store = _run_with_timeout(lambda: ts.ExpertStore(pack, vram_slots=4, device="cpu", warm_start=fifo))
    with store:
        assert store.resident_keys().shape == (0, 2)


def test_fifo_as_trace_is_refused_without_blocking(tmp_path):
    from tierstore.sim.traces import load_trace

    fifo = tmp_path / "t.npy"
    os.mkfifo(fifo)
    with pytest.raises(ts.FormatError, match="FIFO"):
        _run_with_timeout(lambda: load_trace(fifo))


def test_engine_on_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "x.pack"
    os.mkfifo(fifo)
    with pytest.raises(ts.FormatError, match="FIFO"):
        _run_with_timeout(lambda: ts.Engine(fifo, threads=1, device="cpu"))


# -- bounded memory from any header -----------------------------------------------------------
def test_sidecar_naming_a_billion_rows_is_refused_before_any_table(tmp_path, pack):
    import json

    sc = json.loads(open(pack.sidecar_path).read())
    sc.update(n_layers=1 << 14, E=1 << 16, layers=[], checksums={})
    with open(pack.sidecar_path, "w") as f:
        json.dump(sc, f)
    with pytest.raises(ts.FormatError, match="over the limit of 4194304 rows"):
        Pack.open(pack.path)


# -- every bad argument is a TierstoreError ------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(vram_gb=math.nan), "vram_gb|nan"),
        (dict(vram_gb=math.inf), "vram_gb|inf"),
        (dict(ram_gb=-1), "ram_gb"),
        (dict(max_promote=-1), "max_promote"),
        (dict(warm_start=12345), "warm_start"),
    ],
)
def test_bad_store_arguments_are_config_errors(pack, kwargs, pattern):
    with pytest.raises(ts.TierstoreError, match=pattern):
        s = ts.ExpertStore(
            pack, device="cpu", **({"vram_slots": 4} | kwargs if "vram_gb" not in kwargs else kwargs)
        )
        s.close()


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.record(1.5, np.array([[1]])),
        lambda s: s.record(0, "ids"),
        lambda s: s.fire(None),
        lambda s: s.fire([(0, 99)]),
        lambda s: s.promote([(7, 0)]),
        lambda s: s.fire([(0, 1)], max_promote=-1),
    ],
)
def test_bad_call_arguments_are_tierstore_errors(pack, call):
    with ts.ExpertStore(pack, vram_slots=4, device="cpu") as store:
        with pytest.raises(ts.TierstoreError):
            call(store)
        assert_store_consistent(store)


def test_closed_store_releases_its_file_descriptors(pack):
    fds = lambda: len(os.listdir("/proc/self/fd"))  # noqa: E731
    before = fds()
    store = ts.ExpertStore(pack, vram_slots=4, device="cpu")
    store.close()
    assert fds() <= before


# -- warm files: range-checked before any table is built ------------------------------------------
def _poolmon(tmp_path, owners, wall_time=1.0):
    import json

    body = {
        "version": "tierstore-poolmon-v1",
        "pack": {"tag": "fp4", "n_layers": 4, "n_experts": 16, "slot_bytes": 5000},
        "tiers": {"pool": {"capacity": 4, "owners": owners}, "arena": {"capacity": 0, "owners": []}},
        "counters": {},
        "wall_time": wall_time,
        "steps": 0,
    }
    p = tmp_path / "pm.json"
    p.write_text(json.dumps(body))
    return p


def test_warm_inspect_of_a_huge_layer_id_is_small_and_fast(tmp_path, capsys):
    import resource
    import subprocess
    import sys

    p = _poolmon(tmp_path, [[200_000_000, 1, 1.0], [1, 2, 0.5]])
    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30));"
        "from tierstore.cli import main; sys.exit(main(['warm', 'inspect', sys.argv[1]]))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(p)], capture_output=True, text=True, timeout=60, env=child_env()
    )
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "out of range" in r.stdout
    del resource


def test_warm_wall_time_out_of_range_is_a_format_error(tmp_path):
    from tierstore.warm import read_warm_file

    with pytest.raises(ts.FormatError, match="wall_time 1e\\+20 is not a time"):
        read_warm_file(_poolmon(tmp_path, [[0, 1, 1.0]], wall_time=1e20))


# -- races: promote vs close, ensure_resident from two threads ------------------------------------
def test_promote_racing_close_never_leaves_a_ticket_waiting(pack):
    for _ in range(30):
        store = ts.ExpertStore(pack, vram_slots=8, device="cpu", lazy_per_step=0)
        tickets, stop = [], threading.Event()

        def promoter():
            while not stop.is_set():
                try:
                    tickets.append(store.promote([(0, len(tickets) % E)]))
                except ts.ClosedError:
                    return

        t = threading.Thread(target=promoter)
        t.start()
        store.close()
        stop.set()
        t.join(10)
        for tk in tickets:
            try:
                assert tk.wait(timeout=10), "a ticket never finished"
            except ts.ClosedError:
                pass
        assert store.wait_idle(timeout=10)


def test_ensure_resident_from_two_threads_leaks_no_pins(pack):
    with ts.ExpertStore(pack, vram_slots=12, device="cpu", lazy_per_step=0) as store:

        def prefill(seed):
            rng = np.random.default_rng(seed)
            for _ in range(40):
                store.ensure_resident(int(rng.integers(L)), rng.integers(0, E, size=4))

        ts_ = [threading.Thread(target=prefill, args=(s,)) for s in (1, 2)]
        [t.start() for t in ts_]
        [t.join(30) for t in ts_]
        store.step()  # releases the prefill pins
        assert store.stats().pool.pinned == 0
        assert_store_consistent(store)


# -- Ctrl-C in the publish block never leaves the tables apart -------------------------------------
def test_ctrl_c_inside_publish_is_rolled_forward_before_it_is_raised(pack, monkeypatch):
    """A KeyboardInterrupt in the middle of a publish (after the slots committed, inside the
    table write): the rest of the section runs before it leaves the fire, so the tables
    agree, no pin is left and the store keeps serving; no signal handler was touched."""
    import signal

    with ts.ExpertStore(pack, vram_slots=8, ram_gb=0, device="cpu", lazy_per_step=0) as store:
        real = SlotPool.write_owners
        calls = []

        def write_then_interrupted(pool, slots, stream):
            out = real(pool, slots, stream)
            if not calls:
                calls.append(len(slots))
                signal.raise_signal(signal.SIGINT)  # lands mid-section, after the table write
            return out

        monkeypatch.setattr(SlotPool, "write_owners", write_then_interrupted)
        with pytest.raises(KeyboardInterrupt):
            store.fire([(0, 1), (2, 3)])
        assert calls == [2]
        monkeypatch.setattr(SlotPool, "write_owners", real)
        assert store.sections_open == 0  # nothing left half written
        assert_store_consistent(store)  # device table, mirror, states, pins agree
        assert set(map(tuple, store.resident_keys().tolist())) == {(0, 1), (2, 3)}
        assert store.evict([(0, 1), (2, 3)]) == 2  # published and not pinned
        fr = store.fire([(0, 1), (2, 3)])  # and the store keeps serving
        assert fr.promoted == 2 and int(store.slot_table[0, 1]) >= 0
        store.release(fr)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

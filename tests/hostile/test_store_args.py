"""Policy knobs given to ExpertStore: a knob the chosen policy cannot use, or a value
that is not a positive finite number, is a ConfigError naming it, never silently
dropped or turned into the default (as ``policy="lru", half_life=5`` once was)."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import tierstore as ts
from tierstore.testing.packs import make_random_pack


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    p = make_random_pack(tmp_path_factory.mktemp("args"), 2, 4, 4096, seed=3)
    yield p
    p.close()


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(policy="lru", half_life=5), r"half_life=5 given, but the pool policy 'lru' has no half-life"),
        (dict(policy="auto", half_life_s=2.0), r"half_life_s=2.0 given, but the pool policy 'auto'"),
        (dict(policy="LRU", half_life=1), r"pool policy 'lru' has no half-life"),
        (dict(policy={"pool": "lru"}, half_life=4), r"pool policy 'lru' has no half-life"),
        (dict(policy={"name": "lru", "half_life": 3}), r"unknown parameter\(s\) half_life"),
        (dict(policy={"name": "heat", "bogus": 1}), r"unknown parameter\(s\) bogus"),
        (dict(policy="heat", half_life=0), r"half_life must be a finite number > 0, found 0"),
        (dict(policy="heat", half_life=-2), r"half_life must be a finite number > 0"),
        (dict(policy="heat", half_life=math.nan), r"half_life must be a finite number > 0"),
        (dict(policy="heat", half_life=math.inf), r"half_life must be a finite number > 0"),
        (dict(policy="heat", half_life="x"), r"half_life must be a finite number > 0, found 'x'"),
        (dict(policy="heat", half_life=True), r"found True"),
        (dict(policy="hybrid", half_life_s=0.0), r"half_life_s must be a finite number > 0"),
        (dict(policy="heat", half_life=5, half_life_s=3), r"not both"),
        (dict(policy={"name": "heat", "half_life": -3}), r"half-life must be a positive number"),
        (dict(policy={"name": "heat", "half_life": 4}, half_life=4), r"half_life given both"),
        (
            dict(policy={"pool": "heat", "arena": {"name": "heat", "half_life_s": math.nan}}),
            r"half-life must be a positive number",
        ),
        (dict(policy=5), r"pool policy must be a name"),
        (dict(policy={"name": 5}), r"pool policy must be a name"),
        (dict(policy="mru"), r"pool policy 'mru' unknown"),
        (dict(policy="phase", half_life=0), r"half_life must be a finite number > 0, found 0"),
    ],
)
def test_a_policy_knob_that_cannot_apply_is_a_config_error(pack, kwargs, pattern):
    with pytest.raises(ts.ConfigError, match=pattern) as ei:
        ts.ExpertStore(pack, vram_slots=4, device="cpu", **kwargs).close()
    assert "\n" not in str(ei.value)


@pytest.mark.parametrize(
    "kwargs, name, half_life",
    [
        (dict(policy="heat", half_life=7), "heat", 7.0),
        (dict(policy="heat", half_life=np.int64(9)), "heat", 9.0),
        (dict(policy="hybrid", half_life_s=2.5), "hybrid", 2.5),
        (dict(policy="HEAT", half_life=3), "heat", 3.0),
        (dict(policy="phase", half_life=11), "phase", 11.0),
        (dict(policy="phase", half_life_s=1.5), "phase", 1.5),
    ],
)
def test_a_half_life_the_policy_uses_is_honoured(pack, kwargs, name, half_life):
    with ts.ExpertStore(pack, vram_slots=4, device="cpu", **kwargs) as store:
        assert store.pool_policy.name == name and store.pool_policy.half_life == half_life


# -- every number ExpertStore takes: one validation (settings.argument), issue 41 -----------
# Each argument or option, and values it must refuse with a ConfigError naming it, before
# anything is allocated (no engine opened) or written (the pack's directory unchanged).
NAN, INF = math.nan, math.inf
NUMBERS = {  # name -> (how to pass it, bad values beyond the common ones)
    "vram_slots": ("arg", [0, -1, 1.5, 2**31, "8", "deferred "]),
    "vram_gb": ("arg", [0, -1.0, 2.0**31, "2"]),
    "ram_gb": ("arg", [-0.5, 2.0**31, "1"]),
    "max_promote": ("arg", [-1, 2.5, 2**31]),
    "top_k": ("arg", [0, 5, 1.5]),  # the pack has 4 experts: top_k 5 cannot be
    "n_spec": ("arg", [-1, 0.5]),
    "max_seqs": ("arg", [-2, 1.25]),
    "threads": ("opt", [0, 513, 2.5]),
    "lazy_per_step": ("opt", [-1, 0.5, 2**31]),
    "scan_keep": ("opt", [-0.1, 1.5]),
    "fire_rounds": ("opt", [0, 1.5]),
    "latency_window": ("opt", [0, 2**31]),
    "reserve_gb": ("opt", [-1, 2.0**31]),
    "max_gb": ("opt", [-1]),
    "snapshot_every_s": ("opt", [-1]),
    "gate_fp_max": ("opt", [-1, 1.5]),
    "half_life": ("opt", [0, -1]),
}
COMMON_BAD = [NAN, INF, -INF, True, [1], object(), 10**400]
RED_TEAM = [
    (name, bad)
    for name, (_how, extra) in NUMBERS.items()
    for bad in COMMON_BAD + extra
    if not (name == "vram_slots" and bad is None)
]


def _store_kwargs(name, value) -> dict:
    how, _extra = NUMBERS[name]
    kw = dict(vram_slots=4, device="cpu", policy="heat")
    if name == "vram_gb":
        kw.pop("vram_slots")
    kw[name] = value
    return kw


def _refused_before_anything(pack, kw, name):
    from tierstore import process

    engines = {id(e) for e in list(process._engines)}  # the engines of other tests may go
    before = sorted(os.listdir(os.path.dirname(pack.path)))
    with pytest.raises(ts.ConfigError) as ei:
        ts.ExpertStore(pack, **kw).close()
    msg = str(ei.value)
    assert f"{name} must be" in msg or f"{name}=" in msg, msg
    assert "\n" not in msg and len(msg) < 600, msg
    assert not [e for e in list(process._engines) if id(e) not in engines]  # none opened
    assert sorted(os.listdir(os.path.dirname(pack.path))) == before  # nothing written
    return msg


@pytest.mark.parametrize("name, bad", RED_TEAM, ids=[f"{n}={b!r:.20}" for n, b in RED_TEAM])
def test_a_bad_number_is_a_config_error_naming_it_before_anything_is_allocated(pack, name, bad):
    _refused_before_anything(pack, _store_kwargs(name, bad), name)


C = 2**31 - 1  # settings.COUNT_MAX
G = 2**30  # settings.GIB_MAX
RANGES = {  # name -> (integral, lo, hi, lo_open, None allowed, where the store keeps it)
    "vram_slots": (True, 1, C, False, True, lambda s: s.n_slots),
    "vram_gb": (False, 0, G, True, True, None),
    "ram_gb": (False, 0, G, False, True, None),
    "max_promote": (True, 0, C, False, True, lambda s: s.max_promote),
    "top_k": (True, 1, 4, False, True, None),
    "n_spec": (True, 0, C, False, False, None),
    "max_seqs": (True, 0, C, False, False, None),
    "threads": (True, 1, 512, False, True, lambda s: s.config.threads),
    "lazy_per_step": (True, 0, C, False, True, lambda s: s.config.lazy_per_step),
    "scan_keep": (False, 0, 1, False, True, lambda s: s.config.scan_keep),
    "fire_rounds": (True, 1, C, False, True, lambda s: s.config.fire_rounds),
    "latency_window": (True, 1, C, False, True, lambda s: s.config.latency_window),
    "reserve_gb": (False, 0, G, False, True, lambda s: s.config.reserve_gb),
    "max_gb": (False, 0, G, False, True, lambda s: s.config.max_gb),
    "snapshot_every_s": (False, 0, math.inf, False, True, lambda s: s.config.snapshot_every_s),
    "gate_fp_max": (True, 0, C, False, True, None),
    "half_life": (False, 0, math.inf, True, True, lambda s: s.pool_policy.half_life),
}


def _in_range(name, value) -> bool:
    integral, lo, hi, lo_open, none_ok, _where = RANGES[name]
    if value is None:
        return none_ok
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        f = float(value)
    except OverflowError:
        return False
    return (
        math.isfinite(f) and (not integral or f.is_integer()) and lo <= f <= hi and not (lo_open and f == lo)
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=st.sampled_from(sorted(RANGES)),
    value=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(),
        st.integers(min_value=-3, max_value=600),
        st.just(2**31),
        st.text(max_size=5),
        st.booleans(),
        st.none(),
    ),
)
def test_property_every_number_is_taken_as_given_or_refused_naming_it(pack, name, value):
    """Any value of any numeric argument: in range (finite, the right type, integral for a
    count, within its bounds) -> the store opens and uses exactly that value (or, too big
    for this machine, a CapacityError); otherwise a ConfigError naming the argument. Never
    a plain exception, never a silent coercion (1.5 slots is not 1)."""
    assume(not (name == "threads" and isinstance(value, int) and value > 64))  # threads
    kw = _store_kwargs(name, value)
    if name == "vram_slots" and value is None:
        kw["vram_gb"] = 0.001
    try:
        store = ts.ExpertStore(pack, **kw)
    except ts.CapacityError:
        assert _in_range(name, value), value
        return
    except ts.ConfigError as exc:
        assert not _in_range(name, value), (value, str(exc))
        assert f"{name} must be" in str(exc), str(exc)
        return
    with store:
        assert _in_range(name, value), value
        where = RANGES[name][-1]
        if where is not None and value is not None:
            got = where(store)
            assert got == (min(value, 8) if name == "vram_slots" else value), (got, value)


@pytest.mark.parametrize(
    "kw, check",
    [
        (dict(vram_slots=np.int64(3)), lambda s: s.n_slots == 3),
        (dict(vram_slots=3.0), lambda s: s.n_slots == 3),  # integral: the same count
        (dict(vram_slots=3, ram_gb=np.float32(0)), lambda s: s.n_arena_rows == 0),
        (dict(vram_slots=3, lazy_per_step=np.uint8(2)), lambda s: s.config.lazy_per_step == 2),
        (dict(vram_slots=3, scan_keep=np.float64(0.25)), lambda s: s.config.scan_keep == 0.25),
        (dict(vram_slots=3, top_k=4), lambda s: s.config.floor is not None),
        (dict(vram_slots="deferred"), lambda s: not s.sized),
    ],
)
def test_numbers_in_range_of_any_numeric_type_are_taken_as_given(pack, kw, check):
    with ts.ExpertStore(pack, device="cpu", force=True, **kw) as store:
        assert check(store)


@pytest.fixture
def store(pack):
    with ts.ExpertStore(pack, vram_slots=4, device="cpu", lazy_per_step=0) as s:
        yield s


METHOD_CASES = [  # (call, the argument the error must name)
    (lambda s: s.fire([(0, 1)], max_promote=NAN), "max_promote"),
    (lambda s: s.fire([(0, 1)], max_promote=-1), "max_promote"),
    (lambda s: s.fire([(0, 1)], max_promote=1.5), "max_promote"),
    (lambda s: s.fire([(0, 1)], max_promote="2"), "max_promote"),
    (lambda s: s.ensure_resident("x", [1, 2]), "layer"),
    (lambda s: s.ensure_resident(0.5, [1, 2]), "layer"),
    (lambda s: s.ensure_resident(7, [1, 2]), "layer"),
    (lambda s: s.ensure_resident(0, "x"), "topk_ids"),
    (lambda s: s.ensure_resident(0, [1.5, 2.0]), "topk_ids"),
    (lambda s: s.release(None), "release"),
    (lambda s: s.release("result"), "release"),
    (lambda s: s.release(s.promote([(0, 1)])), "release"),
    (lambda s: s.wait_idle(NAN), "timeout"),
    (lambda s: s.wait_idle(-1), "timeout"),
    (lambda s: s.wait_idle(INF), "timeout"),
    (lambda s: s.promote([(0, 1)]).wait(NAN), "timeout"),
    (lambda s: s.promote([(0, 1)]).wait("1"), "timeout"),
    (lambda s: s.fire([(0, 2)]).wait_layer("x"), "layer"),
    (lambda s: s.preheat(__file__, pool_fill=NAN), "pool_fill"),
    (lambda s: s.preheat(__file__, pool_fill=True), "pool_fill"),
    (lambda s: s.engine.submit([0], [4096]).wait(NAN), "timeout"),
    (lambda s: ts.fire_floor(NAN, 6), "n_layers"),
    (lambda s: ts.fire_floor(43, 6, n_spec=INF), "n_spec"),
    (lambda s: ts.fire_floor(43, 6.5), "top_k"),
    (lambda s: ts.fire_floor(43, 6, max_seqs="4"), "max_seqs"),
]


@pytest.mark.parametrize(
    "call, name", METHOD_CASES, ids=[f"{i}-{n}" for i, (_, n) in enumerate(METHOD_CASES)]
)
def test_a_bad_method_argument_is_a_config_error_naming_it(store, call, name):
    with pytest.raises(ts.ConfigError, match=name) as ei:
        call(store)
    assert "\n" not in str(ei.value)
    store.wait_idle(10)
    store.check_invariants()


@pytest.mark.parametrize(
    "n_slots, free_bytes", [(NAN, None), (-1, None), (1.5, None), ("4", None), (2, NAN), (2, -1), (2, 1.5)]
)
def test_finalize_refuses_bad_numbers_before_allocating(pack, n_slots, free_bytes):
    with ts.ExpertStore(pack, vram_slots="deferred", device="cpu") as s:
        with pytest.raises(ts.ConfigError, match="n_slots|free_bytes"):
            s.finalize(n_slots, free_bytes=free_bytes)
        assert not s.sized
        assert s.finalize(2) == 2  # the store is still usable


def test_release_of_another_stores_result_keeps_both_stores_pins(pack):
    """The one call that takes a result from the caller (release): a result of another
    store, of the same pack, is refused and neither store's pins move."""
    with (
        ts.ExpertStore(pack, vram_slots=4, device="cpu") as a,
        ts.ExpertStore(pack, vram_slots=4, device="cpu") as b,
    ):
        fa, fb = a.fire([(0, 1)]), b.fire([(0, 1)])
        for store, other in ((a, fb), (b, fa)):
            with pytest.raises(ts.ConfigError, match="belongs to another store"):
                store.release(other)
        assert a.stats().pool.pinned == 1 and b.stats().pool.pinned == 1
        a.release(fa)
        b.release(fb)
        a.check_invariants(idle=True)
        b.check_invariants(idle=True)

"""Warm-start formats: round trips, sniffing, and one test per rejection reason."""

from __future__ import annotations

import json
import os
import re
import warnings

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierstore.errors import FormatError
from tierstore.testing.packs import make_random_pack
from tierstore.warm import (
    MAX_WARM_FILE_BYTES,
    PackIdentity,
    WarmFile,
    WarmStartWarning,
    WarmTier,
    arena_heat_path,
    encode,
    fit_to_pack,
    load_hint,
    parse_warm_bytes,
    pool_heat_name,
    read_warm_file,
    to_arena_heat,
    to_pool_heat,
    to_poolmon,
    write_atomic,
)

L, E, SLOT = 4, 8, 64


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return make_random_pack(tmp_path_factory.mktemp("pack"), L, E, SLOT, seed=3)


@pytest.fixture(scope="module")
def half_pack(tmp_path_factory):  # layers 0 and 2 written, 1 and 3 holes
    return make_random_pack(tmp_path_factory.mktemp("half"), L, E, SLOT, seed=3, layers=[0, 2])


def poolmon_dict(pack, owners, arena=(), **over):
    ident = PackIdentity.of_pack(pack)
    d = {
        "version": "tierstore-poolmon-v1",
        "pack": {f: getattr(ident, f) for f in ident.__struct_fields__},
        "tiers": {
            "pool": {"capacity": 16, "owners": [list(o) for o in owners]},
            "arena": {"capacity": 32, "owners": [list(o) for o in arena]},
        },
        "counters": {
            "pool": {"hits": 5, "misses": 2, "promotions": 2, "evictions": 0},
            "arena": {"hits": 1, "misses": 1, "promotions": 1, "evictions": 0},
        },
        "wall_time": 1.7e9,
        "steps": 12,
        "policy": "heat",
    }
    d.update(over)
    return d


def pool_heat_dict(owners, **meta):
    m = {"version": "pool-heat-v1", "tag": "fp4", "n_layers": L, "E": E, "slot_bytes": SLOT}
    m.update(meta)
    return {"meta": m, "owners": [list(o) for o in owners]}


def write(tmp_path, obj, name="warm.json"):
    p = tmp_path / name
    p.write_bytes(obj if isinstance(obj, bytes) else json.dumps(obj).encode())
    return str(p)


def hint(path, pack):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wf = load_hint(path, pack)
    return wf, [str(w.message) for w in caught if issubclass(w.category, WarmStartWarning)]


# ------------------------------------------------------------------ round trips
keys_st = st.lists(st.tuples(st.integers(0, L - 1), st.integers(0, E - 1)), unique=True, max_size=L * E)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=keys_st, data=st.data())
def test_poolmon_roundtrip_any_owners_identical(pack, keys, data):
    heat = sorted(
        data.draw(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=len(keys), max_size=len(keys))),
        reverse=True,
    )
    wf = WarmFile(
        "<mem>",
        "poolmon",
        PackIdentity.of_pack(pack),
        WarmTier(np.array(keys, np.int64).reshape(-1, 2), np.array(heat), 16),
        WarmTier(np.array(keys[::-1], np.int64).reshape(-1, 2), np.linspace(1, 0, len(keys)), 32),
        wall_time=5.0,
        steps=7,
    )
    back = parse_warm_bytes(encode(to_poolmon(wf)), "x.json")
    assert back.kind == "poolmon" and back.identity == wf.identity
    np.testing.assert_array_equal(back.pool.keys, wf.pool.keys)
    np.testing.assert_array_equal(back.pool.heat, wf.pool.heat)
    np.testing.assert_array_equal(back.arena.keys, wf.arena.keys)
    assert (back.pool.capacity, back.arena.capacity, back.steps) == (16, 32, 7)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=keys_st)
def test_pool_heat_and_arena_heat_roundtrip_keep_order(pack, keys):
    wf = WarmFile(
        "<mem>",
        "poolmon",
        PackIdentity.of_pack(pack),
        WarmTier(np.array(keys, np.int64).reshape(-1, 2), np.ones(len(keys))),
        WarmTier.empty(),
    )
    ph_bytes = encode(to_pool_heat(wf))
    assert b"\n" not in ph_bytes  # pool-heat-v1 is one line
    ph = parse_warm_bytes(ph_bytes, "ph.json")
    assert ph.kind == "pool-heat" and ph.pool.ranked
    assert ph.pool.keys.tolist() == [list(k) for k in keys]
    assert np.all(np.diff(ph.pool.heat) < 0)  # rank heat strictly decreasing
    ah = parse_warm_bytes(encode(to_arena_heat(wf)), "a.heat.json")
    assert ah.kind == "arena-heat" and ah.identity is None
    assert ah.arena.keys.tolist() == [list(k) for k in keys]


def test_poolmon_unsorted_owners_are_sorted_hottest_first(pack, tmp_path):
    wf = read_warm_file(write(tmp_path, poolmon_dict(pack, [(0, 1, 1.0), (0, 2, 9.0), (1, 1, 5.0)])))
    assert wf.pool.keys.tolist() == [[0, 2], [1, 1], [0, 1]]


def test_names_follow_vllm_moet():
    assert pool_heat_name("delta", 1, 2) == "pool-heat.delta.rank1of2.json"
    assert pool_heat_name("fp4", 0, 1, pp=(1, 4)) == "pool-heat.fp4.rank0of1.pp1of4.json"
    assert arena_heat_path("/d/fp4.rank0of1.pack") == "/d/fp4.rank0of1.pack.heat.json"


def test_write_atomic_replaces_and_leaves_no_temp(tmp_path):
    p = tmp_path / "f.json"
    p.write_bytes(b"old")
    write_atomic(p, b"new")
    assert p.read_bytes() == b"new" and os.listdir(tmp_path) == ["f.json"]


def test_write_atomic_into_missing_dir_raises_naming_target(tmp_path):
    with pytest.raises(OSError, match="nodir/f.json: write"):
        write_atomic(tmp_path / "nodir" / "f.json", b"x")


# ------------------------------------------------------------------ rejections (strict read)
@pytest.mark.parametrize(
    "raw, reason",
    [
        (b"", "empty file"),
        (
            b'{"meta": {"version": "pool-heat-v1", "tag": "fp4"',
            "warm-start file is not valid JSON: truncated",
        ),
        (b"[1, 2, 3]", "not a warm-start file"),
        (b'{"hello": 1}', "not a warm-start file"),
        (b'{"meta": {"version": "pool-heat-v2"}, "owners": []}', "meta.version 'pool-heat-v2'"),
        (b'{"version": 2, "keys": []}', "arena heat version 2"),
        (b'{"version": true, "keys": []}', "arena heat version True"),
        (b'{"version": 1, "keys": [[0, "a"]]}', "Expected `int`, got `str` - at `$.keys[0][1]`"),
        (b'{"version": 1, "keys": [[0, -1]]}', "keys[0] = [0, -1]: layer and expert must be >= 0"),
        (b'{"version": 1, "keys": [[0, 1, 2]]}', "Expected `array` of length 2"),
    ],
)
def test_bad_bytes_rejected_with_reason(tmp_path, raw, reason):
    p = write(tmp_path, raw)
    with pytest.raises(FormatError) as ei:
        read_warm_file(p)
    assert str(ei.value).startswith(p + ":") and reason in str(ei.value)


def test_poolmon_wrong_version_rejected(pack, tmp_path):
    p = write(tmp_path, poolmon_dict(pack, [], version="tierstore-poolmon-v9"))
    with pytest.raises(FormatError, match="poolmon version 'tierstore-poolmon-v9', expected"):
        read_warm_file(p)


def test_poolmon_unknown_field_and_bad_heat_rejected(pack, tmp_path):
    with pytest.raises(FormatError, match=r"unknown field `extra`"):
        read_warm_file(write(tmp_path, poolmon_dict(pack, [], extra=1)))
    with pytest.raises(FormatError, match=r"tiers.pool.owners\[0\]: heat -1.0"):
        read_warm_file(write(tmp_path, poolmon_dict(pack, [(0, 0, -1.0)])))


def test_oversized_file_refused_before_parse(tmp_path):
    p = tmp_path / "big.json"
    with open(p, "wb") as f:
        f.truncate(MAX_WARM_FILE_BYTES + 1)
    with pytest.raises(FormatError, match="larger than the 67108864-byte cap"):
        read_warm_file(p)


# ------------------------------------------------------------------ hints against a pack
def test_hint_geometry_mismatch_warns_once_and_starts_cold(pack, tmp_path):
    p = write(tmp_path, pool_heat_dict([(0, 1)], E=16))
    wf, msgs = hint(p, pack)
    assert wf is None and len(msgs) == 1
    assert msgs[0].startswith(p + ":") and "n_experts 16, pack has 8" in msgs[0]
    assert msgs[0].endswith("starting cold")


def test_hint_other_checkpoint_same_geometry_is_refused(pack, tmp_path):
    d = poolmon_dict(pack, [(0, 1, 1.0)])
    d["pack"]["ckpt_id"] = "someone-else"
    wf, msgs = hint(write(tmp_path, d), pack)
    assert wf is None and "ckpt_id 'someone-else', pack has 'random-seed3'" in msgs[0]
    d = poolmon_dict(pack, [(0, 1, 1.0)])
    d["pack"]["key20"] = "0" * 20
    wf, msgs = hint(write(tmp_path, d), pack)
    assert wf is None and "key20" in msgs[0]


def test_hint_truncated_file_warns_and_starts_cold(pack, tmp_path):
    raw = encode(to_poolmon(read_warm_file(write(tmp_path, poolmon_dict(pack, [(0, 1, 1.0)])))))
    p = write(tmp_path, raw[: len(raw) // 2], "trunc.json")
    wf, msgs = hint(p, pack)
    assert wf is None and len(msgs) == 1 and "truncated" in msgs[0] and p in msgs[0]


def test_hint_missing_file_warns_and_starts_cold(pack, tmp_path):
    wf, msgs = hint(str(tmp_path / "nope.json"), pack)
    assert wf is None and msgs == [f"{tmp_path / 'nope.json'}: warm-start file not found; starting cold"]


def test_hint_out_of_range_and_duplicates_dropped_rest_kept(pack, tmp_path):
    owners = [(0, 1), (9, 0), (0, 8), (2, 3), (0, 1), (3, 7)]
    wf, msgs = hint(write(tmp_path, pool_heat_dict(owners)), pack)
    assert wf.pool.keys.tolist() == [[0, 1], [2, 3], [3, 7]]
    assert wf.skipped == {"pool: out of range": 2, "pool: duplicate": 1}
    assert len(msgs) == 1 and "2 pool: out of range" in msgs[0] and "1 pool: duplicate" in msgs[0]


def test_hint_unwritten_layers_dropped(half_pack, tmp_path):
    wf, msgs = hint(write(tmp_path, {"version": 1, "keys": [[1, 0], [0, 0], [3, 3], [2, 5]]}), half_pack)
    assert wf.arena.keys.tolist() == [[0, 0], [2, 5]]
    assert wf.skipped == {"arena: layer not written": 2} and "layer not written" in msgs[0]


def test_fit_keeps_heat_aligned_with_keys(pack, tmp_path):
    wf = read_warm_file(write(tmp_path, poolmon_dict(pack, [(0, 1, 9.0), (7, 1, 8.0), (1, 2, 7.0)])))
    fitted = fit_to_pack(wf, pack)
    assert fitted.pool.keys.tolist() == [[0, 1], [1, 2]] and fitted.pool.heat.tolist() == [9.0, 7.0]


def test_strict_msgspec_types_reject_bool_layer(tmp_path):
    with pytest.raises(FormatError, match="got `bool`"):
        read_warm_file(write(tmp_path, pool_heat_dict([(True, 1)])))
    assert msgspec.json.decode(
        encode(to_arena_heat(WarmFile("m", "arena-heat", None, WarmTier.empty(), WarmTier.empty())))
    ) == {"version": 1, "keys": []}


# ------------------------------------------------------------------ fuzz: never a crash
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "meta",
                    "owners",
                    "version",
                    "keys",
                    "tiers",
                    "pack",
                    "pool",
                    "tag",
                    "n_layers",
                    "E",
                    "slot_bytes",
                    "capacity",
                    "x",
                ]
            ),
            inner,
            max_size=5,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(value=json_values)
def test_fuzz_any_json_parses_or_raises_format_error(value):
    try:
        raw = json.dumps(value).encode()
    except ValueError:
        return
    try:
        wf = parse_warm_bytes(raw, "fuzz.json")
    except FormatError as exc:
        assert str(exc).startswith("fuzz.json:")
        return
    assert wf.kind in ("poolmon", "pool-heat", "arena-heat")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_mutated_pool_heat_never_crashes_a_hint(pack, tmp_path, data):
    raw = bytearray(json.dumps(pool_heat_dict([(0, 1), (1, 2), (3, 7)])).encode())
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    p = tmp_path / "mut.json"
    p.write_bytes(bytes(raw))
    wf, msgs = hint(str(p), pack)
    if wf is None:
        assert len(msgs) == 1 and msgs[0].startswith(str(p))
    else:
        assert ((wf.pool.keys[:, 0] < L) & (wf.pool.keys[:, 1] < E)).all()


def test_huge_layer_number_is_a_format_error(tmp_path):
    with pytest.raises(FormatError, match="out of the int64 range"):
        read_warm_file(write(tmp_path, b'{"version": 1, "keys": [[0, 1], [18446744073709551616, 0]]}'))


@pytest.mark.parametrize(
    "raw, reason",
    [
        (
            b'{"meta": {"version": "pool-heat-v1", "tag": "fp4", "n_layers": 4, "E": 8, "slot_bytes": 64}}',
            "pool-heat: Object missing required field `owners`",
        ),
        (b'{"keys": [[0, 1]]}', "arena heat version None, expected 1"),
        (b'{"version": "tierstore-poolmon-v1", "pack": {}}', "Object missing required field"),
    ],
)
def test_missing_required_field_names_the_format(tmp_path, raw, reason):
    with pytest.raises(FormatError, match=re.escape(reason)):
        read_warm_file(write(tmp_path, raw))


HOSTILE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "warm")


@pytest.mark.parametrize("name", sorted(os.listdir(HOSTILE)))
def test_hostile_sample_file_is_an_error_strict_and_a_cold_start_as_hint(pack, name, capsys):
    from tierstore.cli import main

    path = os.path.join(HOSTILE, name)
    with pytest.raises(FormatError) as ei:
        read_warm_file(path)
    assert str(ei.value).startswith(path + ": ") and "\n" not in str(ei.value)
    wf, msgs = hint(path, pack)
    assert wf is None and len(msgs) == 1 and msgs[0].startswith(path)
    assert main(["warm", "inspect", path]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"tierstore: error: {path}: ") and err.count("\n") == 1

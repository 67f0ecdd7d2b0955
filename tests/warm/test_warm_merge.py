"""Merge and summary properties; the poolmon JSON Schema agrees with the structs."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierstore.errors import FormatError
from tierstore.warm import PackIdentity, Poolmon, WarmFile, WarmTier, merge, summarize
from tierstore.warm.formats import TierOwners

L, E = 3, 5
IDENT = PackIdentity(
    tag="fp4", n_layers=L, n_experts=E, slot_bytes=64, stride=4096, ckpt_id="c", key20="0123456789abcdef0123"
)


@st.composite
def warm_files(draw):
    dense = draw(st.lists(st.integers(0, L * E - 1), unique=True, min_size=1, max_size=L * E))
    heat = sorted(
        draw(st.lists(st.floats(0.01, 100), min_size=len(dense), max_size=len(dense))), reverse=True
    )
    keys = np.array([[k // E, k % E] for k in dense], np.int64)
    wall = draw(st.floats(0, 1e4))
    return WarmFile(
        f"f{draw(st.integers(0, 99))}",
        "poolmon",
        IDENT,
        WarmTier(keys, np.array(heat), 8),
        WarmTier.empty(),
        wall_time=wall,
        steps=1,
    )


@settings(max_examples=80, deadline=None)
@given(a=warm_files(), b=warm_files())
def test_merge_is_order_independent_and_conserves_shares(a, b):
    ab, ba = merge([a, b]), merge([b, a])
    assert sorted(map(tuple, ab.pool.keys.tolist())) == sorted(map(tuple, ba.pool.keys.tolist()))
    d_ab = dict(zip(map(tuple, ab.pool.keys.tolist()), ab.pool.heat))
    d_ba = dict(zip(map(tuple, ba.pool.keys.tolist()), ba.pool.heat))
    assert all(d_ab[k] == pytest.approx(d_ba[k]) for k in d_ab)
    assert ab.pool.heat.sum() == pytest.approx(2.0)  # each file contributes shares summing to 1
    assert np.all(np.diff(ab.pool.heat) <= 1e-12)  # hottest first
    assert ab.steps == 2 and ab.wall_time == max(a.wall_time, b.wall_time)


@settings(max_examples=50, deadline=None)
@given(a=warm_files())
def test_merge_of_one_file_keeps_its_order(a):
    m = merge([a])
    # merge ranks by the normalised shares: heats one ulp apart can round to one share,
    # and a tie is broken by key, so "distinct" is judged on the shares
    distinct = np.all(np.diff(a.pool.heat / a.pool.heat.sum()) < 0)
    if distinct:
        assert m.pool.keys.tolist() == a.pool.keys.tolist()
    assert m.pool.heat == pytest.approx(a.pool.heat / a.pool.heat.sum())


@settings(max_examples=50, deadline=None)
@given(a=warm_files(), b=warm_files(), half_life=st.floats(1, 1e4))
def test_merge_half_life_weights_the_older_file_down(a, b, half_life):
    m = merge([a, b], half_life_s=half_life)
    older = min(a.wall_time, b.wall_time)
    newest = max(a.wall_time, b.wall_time)
    expected_total = 1.0 + 0.5 ** ((newest - older) / half_life)
    assert m.pool.heat.sum() == pytest.approx(expected_total)


def test_merge_refuses_other_checkpoint_naming_it():
    a = WarmFile("a.json", "poolmon", IDENT, WarmTier.empty(), WarmTier.empty())
    other = PackIdentity(**{**{f: getattr(IDENT, f) for f in IDENT.__struct_fields__}, "ckpt_id": "d"})
    b = WarmFile("b.json", "poolmon", other, WarmTier.empty(), WarmTier.empty())
    with pytest.raises(FormatError, match=r"^b.json: does not match a.json: ckpt_id 'd', expected 'c'$"):
        merge([a, b])


def test_summary_counts_layers_and_problems():
    keys = np.array([[0, 1], [0, 1], [2, 4], [2, 9]], np.int64)
    wf = WarmFile(
        "s.json",
        "pool-heat",
        IDENT,
        WarmTier(keys, np.array([4.0, 3.0, 2.0, 1.0]), None, True),
        WarmTier.empty(),
    )
    s = summarize(wf, top_n=1)
    assert s["tiers"]["pool"]["per_layer"] == [2, 0, 2]
    assert s["problems"] == {"pool: out of range": 1, "pool: duplicate": 1}
    assert s["tiers"]["pool"]["top_n_share"] == pytest.approx(0.4)


def test_json_schema_names_exactly_the_struct_fields():
    here = os.path.dirname(os.path.dirname(__file__))
    schema = json.load(open(os.path.join(here, "..", "docs", "warmstart.schema.json")))
    assert set(schema["properties"]) == set(Poolmon.__struct_fields__)
    assert set(schema["properties"]["pack"]["properties"]) == set(PackIdentity.__struct_fields__)
    assert set(schema["$defs"]["tier"]["properties"]) == set(TierOwners.__struct_fields__)
    assert schema["properties"]["version"]["const"] == "tierstore-poolmon-v1"

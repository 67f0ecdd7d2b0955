"""Property tests: writer -> reader round trips, names, and a sidecar fuzz target that
may only ever produce FormatError (never another exception, never a crash)."""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierstore import FormatError, Pack, PackWriter
from tierstore.format.sidecar import (
    PackName,
    RowLayout,
    RowSection,
    Sidecar,
    encode_sidecar,
    load_sidecar,
    round_up,
)
from tierstore.testing.packs import make_random_pack

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@st.composite
def geometries(draw):
    n_layers = draw(st.integers(1, 5))
    n_experts = draw(st.integers(1, 6))
    slot = draw(st.integers(1, 9000))
    layers = draw(st.sets(st.integers(0, n_layers - 1)))
    return n_layers, n_experts, slot, sorted(layers)


@FAST
@given(geo=geometries(), seed=st.integers(0, 2**32 - 1))
def test_written_rows_read_back_and_holes_stay_unwritten(geo, seed):
    n_layers, n_experts, slot, layers = geo
    with tempfile.TemporaryDirectory() as d:
        with make_random_pack(d, n_layers, n_experts, slot, seed=seed, layers=layers) as p:
            assert (p.n_layers, p.n_experts, p.slot_bytes) == (n_layers, n_experts, slot)
            assert p.stride == round_up(slot) and p.stride % 4096 == 0
            assert os.path.getsize(p.path) == n_layers * n_experts * p.stride
            assert list(p.layers) == layers
            assert list(np.flatnonzero(p.written)) == layers
            assert p.verify().rows_checked == len(layers) * n_experts
            rng = np.random.default_rng(seed)
            for layer in layers:
                e = int(rng.integers(n_experts))
                row = p.read_row(layer, e)
                assert row.shape == (slot,) and (row != 0).all()


@settings(max_examples=10, deadline=None)
@given(order=st.permutations(range(4)), n_experts=st.integers(1, 4))
def test_layers_written_in_any_order_are_listed_sorted(order, n_experts):
    with tempfile.TemporaryDirectory() as d:
        rows = {l: np.full((n_experts, 64), l + 1, np.uint8) for l in range(4)}
        with PackWriter(d, tag="t", n_layers=4, n_experts=n_experts, slot_bytes=64, ckpt_id="c") as w:
            for layer in order[:3]:
                w.write_layer(layer, rows[layer])
            path = w.path
        with Pack.open(path) as p:
            assert list(p.layers) == sorted(order[:3])
            for layer in order[:3]:
                assert (p.read_row(layer, n_experts - 1) == layer + 1).all()


@st.composite
def layouts(draw, slot_bytes):
    cuts = sorted(draw(st.sets(st.integers(1, slot_bytes - 1), max_size=4))) if slot_bytes > 1 else []
    edges = [0] + cuts + [slot_bytes]
    sections = [
        RowSection(
            name=f"s{i}",
            offset=a,
            bytes=b - a,
            dtype="uint8",
            shape=[b - a],
            codec=draw(st.sampled_from(["raw", "e2m1", "e8m0"])),
        )
        for i, (a, b) in enumerate(zip(edges, edges[1:]))
    ]
    return RowLayout(
        kind=draw(st.sampled_from(["fp4", "base", "opaque"])),
        sections=sections,
        order=draw(st.sampled_from(["linear", "fragmajor"])),
        params=draw(st.dictionaries(st.sampled_from("HIN"), st.integers(1, 9999))),
    )


@FAST
@given(data=st.data(), slot=st.integers(1, 5000), n_layers=st.integers(1, 4), n_experts=st.integers(1, 4))
def test_sidecar_encode_decode_round_trip(data, slot, n_layers, n_experts):
    layers = sorted(data.draw(st.sets(st.integers(0, n_layers - 1))))
    sums = {
        l: data.draw(st.lists(st.integers(0, 2**64 - 1), min_size=n_experts, max_size=n_experts))
        for l in layers
    }
    sc = Sidecar(
        version=2,
        tag="fp4",
        E=n_experts,
        n_layers=n_layers,
        slot_bytes=slot,
        stride=round_up(slot),
        ckpt_id=data.draw(st.text(max_size=20)),
        zero_mode="none",
        quantizer_abi="abi",
        layers=layers,
        layout=data.draw(st.none() | layouts(slot)),
        checksum="xxh3_64",
        checksums=sums,
    )
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "fp4.rank0of1.json")
        with open(path, "wb") as f:
            f.write(encode_sidecar(sc))
        back, unknown = load_sidecar(path, key20_in_name=False)
    assert back == sc and unknown == []


@FAST
@given(
    tag=st.from_regex(r"[A-Za-z0-9_\-]{1,12}", fullmatch=True),
    key=st.none() | st.from_regex(r"[0-9a-f]{20}", fullmatch=True),
    world=st.integers(1, 64),
    data=st.data(),
)
def test_pack_name_round_trip(tag, key, world, data):
    rank = data.draw(st.integers(0, world - 1))
    q = data.draw(st.none() | st.integers(1, 8))
    pp = None if q is None else (data.draw(st.integers(0, q - 1)), q)
    name = PackName(tag, key, rank, world, pp)
    assert PackName.parse("/x/" + name.filename()) == name


_VALID = {
    "version": 2,
    "tag": "fp4",
    "E": 2,
    "n_layers": 2,
    "slot_bytes": 10,
    "stride": 4096,
    "ckpt_id": "c",
    "zero_mode": "none",
    "quantizer_abi": "a",
    "layers": [0],
    "checksum": "xxh3_64",
    "checksums": {"0": [1, 2]},
}

_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=80, deadline=None)
@given(field=st.sampled_from(sorted(_VALID) + ["layout", "extra"]), value=_json_values)
def test_fuzzed_sidecar_field_gives_format_error_or_a_valid_pack(field, value):
    side = dict(_VALID, **{field: value})
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "fp4.rank0of1.pack"), "wb") as f:
            f.truncate(2 * 2 * 4096)
        with open(os.path.join(d, "fp4.rank0of1.json"), "w") as f:
            json.dump(side, f)
        try:
            Pack.open(os.path.join(d, "fp4.rank0of1.pack")).close()
        except FormatError as exc:
            assert "fp4.rank0of1" in str(exc) and "\n" not in str(exc)


@settings(max_examples=100, deadline=None)
@given(raw=st.binary(max_size=300))
def test_fuzzed_sidecar_bytes_give_format_error(raw):
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "fp4.rank0of1.pack"), "wb") as f:
            f.truncate(4096)
        with open(os.path.join(d, "fp4.rank0of1.json"), "wb") as f:
            f.write(raw)
        try:
            Pack.open(os.path.join(d, "fp4.rank0of1.pack")).close()
        except FormatError as exc:
            assert "fp4.rank0of1.json" in str(exc)

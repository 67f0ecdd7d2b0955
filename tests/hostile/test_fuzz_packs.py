"""Mutation fuzzing on top of the enumerated corpus: sidecars edited at random JSON
paths or at random bytes must be refused with one line naming the file, or open and
serve exactly the bytes written; the JSON shape scan agrees with a byte-by-byte
reference on any input, split into chunks anywhere."""

from __future__ import annotations

import json
import os
import time
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

import tierstore as ts
from hostile.common import CASE_SECONDS
from hostile.packs import ROWS, SLOT, STRIDE, STYLES, E, pack_name, sidecar, write_pack
from tierstore.files import untrusted
from tierstore.format import Pack

SETTINGS = dict(
    deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


def _set_path(obj, path, value):
    if not path:
        return value
    obj[path[0]] = _set_path(obj[path[0]], path[1:], value)
    return obj


def _judge(d: str, target: str) -> None:
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            p = Pack.open(target)
        except ts.TierstoreError as exc:
            msg = str(exc)
            assert "\n" not in msg and d in msg, msg
            assert time.perf_counter() - t0 < CASE_SECONDS
            return
    with p:
        # An old vLLM-Moet sidecar (no key20 in the name, no checksums) whose geometry was
        # damaged into another valid one (slot_bytes 100 -> 300) cannot be told from a real
        # pack of that geometry: nothing in it contradicts the file. The reader must then
        # serve exactly the file's bytes at the declared geometry; every pack that can tell
        # (checksums, key20, or the geometry written) must serve the rows written.
        undetectable = (
            not p.has_checksums
            and "v2" not in os.path.basename(target)
            and (p.slot_bytes, p.n_experts, p.stride) != (SLOT, E, STRIDE)
        )
        with open(target, "rb") as f:
            body = f.read()
        for layer in p.layers:
            for e in range(p.n_experts):
                got = p.read_row(layer, e)
                if undetectable:
                    at = p.row_offset(layer, e)
                    want = np.frombuffer(body[at : at + p.slot_bytes], np.uint8)
                else:
                    want = ROWS[layer, e]
                assert np.array_equal(got, want), (layer, e, undetectable)
        try:
            p.verify()
        except ts.TierstoreError as exc:
            assert "\n" not in str(exc)
    assert time.perf_counter() - t0 < CASE_SECONDS


@hsettings(max_examples=150, **SETTINGS)
@given(data=st.data())
def test_a_sidecar_edited_at_any_json_path_is_refused_or_served_exactly(tmp_path_factory, data):
    style = data.draw(st.sampled_from(STYLES), label="style")
    side = sidecar(style)
    path = data.draw(st.sampled_from(list(_paths(side))[1:]), label="path")
    value = data.draw(json_values, label="value")
    side = _set_path(side, path, value)
    d = str(tmp_path_factory.mktemp("fz"))
    target = write_pack(d, style, side, name=pack_name(style))
    _judge(d, target)


@hsettings(max_examples=150, **SETTINGS)
@given(data=st.data())
def test_a_sidecar_damaged_at_any_byte_is_refused_or_served_exactly(tmp_path_factory, data):
    style = data.draw(st.sampled_from(STYLES), label="style")
    raw = bytearray(json.dumps(sidecar(style), sort_keys=True).encode())
    for _ in range(data.draw(st.integers(1, 4), label="edits")):
        at = data.draw(st.integers(0, len(raw)), label="at")
        how = data.draw(st.sampled_from(["flip", "insert", "delete"]), label="how")
        if how == "flip" and at < len(raw):
            raw[at] ^= data.draw(st.integers(1, 255), label="mask")
        elif how == "insert":
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=8), label="bytes")
        else:
            del raw[at : at + data.draw(st.integers(1, 16), label="span")]
    d = str(tmp_path_factory.mktemp("fz"))
    target = write_pack(d, style, raw_side=bytes(raw))
    _judge(d, target)


def _reference_shape(raw: bytes) -> tuple[int, int]:
    """Byte by byte: a quote after an even run of backslashes is a string boundary."""
    depth = deepest = longest = run = 0
    start = -1
    for i, c in enumerate(raw):
        if c == 0x22 and run % 2 == 0:
            if start >= 0:
                longest, start = max(longest, i - start - 1), -1
            else:
                start = i
        elif start < 0 and c in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif start < 0 and c in b"]}":
            depth -= 1
        run = run + 1 if c == 0x5C else 0
    if start >= 0:
        longest = max(longest, len(raw) - start - 1)
    return deepest, longest


@hsettings(max_examples=400, deadline=None)
@given(
    raw=st.binary(max_size=80) | st.lists(st.sampled_from(list(b'[]{}"\\ a')), max_size=80).map(bytes),
    chunk=st.integers(1, 9),
)
def test_the_json_shape_scan_matches_a_byte_by_byte_reference(raw, chunk):
    old = untrusted._SCAN_CHUNK
    untrusted._SCAN_CHUNK = chunk
    try:
        assert untrusted.json_shape(raw) == _reference_shape(raw)
    finally:
        untrusted._SCAN_CHUNK = old


@pytest.mark.parametrize("unit", [b'\\"', b"\\\\", b"[", b'"', b"a"])
def test_the_shape_scan_of_a_file_at_the_cap_is_fast_and_small(unit):
    import tracemalloc

    raw = b'"' + unit * ((64 << 20) // len(unit) - 1)
    tracemalloc.start()
    t0 = time.perf_counter()
    untrusted.json_shape(raw)  # no early stop: the whole 64 MiB
    elapsed = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 32 << 20, f"{peak >> 20} MiB of scratch for a 64 MiB file"
    assert elapsed < 20.0  # ~2 s on a loaded 2-core machine
    if unit != b'"':  # "" "" ... breaks no limit: no early stop
        t0 = time.perf_counter()
        untrusted.json_shape(raw, 16, 1 << 16)
        assert time.perf_counter() - t0 < 0.5  # a hostile one stops at its first chunk

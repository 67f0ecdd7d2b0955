"""Trace reader (one test per rejection, naming file and row), atomic writer,
capture hook, and the synthetic router."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierstore.errors import CapacityError, ConfigError, FormatError
from tierstore.sim import synth, traces

FLAME = Path("/work/shared/traces/flame_moe_290m_pretrain_2048tok.npy")


def write(tmp_path, rows, meta=None, name="t.npy"):
    path = tmp_path / name
    np.save(path, np.asarray(rows))
    if meta is not None:
        path.with_suffix("").with_suffix(".meta.json").write_text(json.dumps(meta))
    return path


@pytest.mark.skipif(not FLAME.exists(), reason="shared FLAME trace not present")
def test_flame_trace_loads_with_dense_layers():
    tr = traces.load_trace(FLAME)
    assert (tr.n_layers, tr.n_experts, tr.n_ticks, tr.n_rows) == (8, 64, 2048, 98304)
    assert tr.layer_ids.tolist() == list(range(2, 10)) and tr.keys.max() < 512
    np.testing.assert_array_equal(tr.to_rows(), np.load(FLAME))


@pytest.mark.parametrize(
    "rows, meta, message",
    [
        (np.zeros((4, 2), np.int32), None, r"shape \(4, 2\), expected \[rows, 3\]"),
        (np.zeros((4, 3), np.float32), None, r"dtype float32, expected int32"),
        ([[0, 0, 1], [-1, 0, 1]], None, r"row 1: tick -1, expected >= 0"),
        ([[0, 0, 1], [2, 0, 1], [1, 0, 3]], None, r"row 2: tick 1 after tick 2, expected ticks sorted"),
        ([[0, -2, 1]], None, r"row 0: layer -2, expected >= 0"),
        ([[0, 0, 1], [0, 1, 64]], {"num_experts": 64}, r"row 1: expert 64, expected in \[0, 64\)"),
        (
            [[0, 2, 1], [0, 5, 1]],
            {"layers_present": [2, 3]},
            r"row 1: layer 5, expected one of layers_present \[2, 3\]",
        ),
    ],
)
def test_bad_trace_fails_fast_naming_file_and_row(tmp_path, rows, meta, message):
    path = write(
        tmp_path,
        np.asarray(rows, dtype=np.asarray(rows).dtype if isinstance(rows, np.ndarray) else np.int32),
        meta,
    )
    with pytest.raises(FormatError, match=message) as info:
        traces.load_trace(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "meta, where",
    [
        ({"num_experts": "64"}, r"got `str` - at `\$.num_experts`"),
        ({"num_experts": True}, r"got `bool` - at `\$.num_experts`"),
        ({"num_experts": 64.0}, r"got `float` - at `\$.num_experts`"),
        ({"num_experts": 0}, r"Expected `int` >= 1 - at `\$.num_experts`"),
        ({"num_experts": 1 << 40}, r"Expected `int` <= 1048576 - at `\$.num_experts`"),
        ({"layers_present": 2}, r"got `int` - at `\$.layers_present`"),
        ({"layers_present": [2, "3"]}, r"got `str` - at `\$.layers_present\[1\]`"),
        ({"name": ["x"]}, r"got `array` - at `\$.name`"),
        ({"top_k": -1}, r"Expected `int` >= 1 - at `\$.top_k`"),
    ],
)
def test_meta_fields_the_simulator_reads_are_typed(tmp_path, meta, where):
    # They were read as int(meta["num_experts"]): a string or a list was a traceback,
    # 2.5 silently 2, True silently 1, 10**12 an allocation the size of the key space.
    path = write(tmp_path, np.array([[0, 0, 1]], np.int32), meta)
    with pytest.raises(FormatError, match="t.meta.json: trace metadata field error: .*" + where):
        traces.load_trace(path)


def test_meta_keeps_fields_it_does_not_read(tmp_path):
    path = write(
        tmp_path,
        np.array([[0, 0, 1]], np.int32),
        {"num_experts": 4, "model": {"any": [1, "thing"]}, "name": "m"},
    )
    tr = traces.load_trace(path)
    assert tr.n_experts == 4 and tr.name == "m" and tr.meta["model"] == {"any": [1, "thing"]}


def test_an_expert_id_past_the_key_space_is_refused_naming_its_row(tmp_path):
    # max(expert) + 1 sized every policy's per-key arrays: 2**31 - 1 ran out of memory.
    path = write(tmp_path, np.array([[0, 0, 1], [0, 0, 5], [1, 0, (1 << 31) - 1]], np.int32))
    with pytest.raises(FormatError, match=r"row 2: expert 2147483647, more than the 1,048,576"):
        traces.load_trace(path)
    # in range per layer, too many layers x experts together
    rows = np.array([[0, layer, traces.MAX_KEYS // 4] for layer in range(8)], np.int32)
    with pytest.raises(CapacityError, match=r"8 layers x 262145 experts = 2,097,160 keys"):
        traces.load_trace(write(tmp_path, rows))


@settings(max_examples=60, deadline=None)
@given(
    ticks=st.integers(0, 9),
    batch=st.integers(1, 3),
    prefill_tokens=st.integers(0, 5),
    prefill_every=st.integers(0, 4),
    layers=st.integers(1, 3),
    top_k=st.integers(1, 3),
)
def test_synthetic_rows_counts_what_the_generator_makes(
    ticks, batch, prefill_tokens, prefill_every, layers, top_k
):
    kw = dict(
        batch=batch, prefill_tokens=prefill_tokens, prefill_every=prefill_every, n_layers=layers, top_k=top_k
    )
    tr = synth.synthetic_trace(ticks, n_experts=8, **kw)
    assert synth.synthetic_rows(ticks, **kw) == tr.n_rows


def test_a_synthetic_trace_too_large_is_refused_before_generating():
    with pytest.raises(CapacityError, match="synthetic trace: 4096 layers x 65536 experts"):
        synth.synthetic_trace(1, n_layers=4096, n_experts=65536)
    with pytest.raises(CapacityError, match=r"synthetic trace: [\d,]+ rows need [\d.]+ GiB"):
        synth.synthetic_trace(1 << 24, batch=1 << 12)


def test_not_npy_and_corrupt_meta_are_format_errors(tmp_path):
    junk = tmp_path / "junk.npy"
    junk.write_bytes(b"not a numpy file")
    with pytest.raises(FormatError, match="junk.npy: not a .npy routing trace"):
        traces.load_trace(junk)
    path = write(tmp_path, np.zeros((1, 3), np.int32))
    path.with_suffix("").with_suffix(".meta.json").write_text("{oops")
    with pytest.raises(FormatError, match=r"t.meta.json: trace metadata is not valid JSON"):
        traces.load_trace(path)


@settings(max_examples=30, deadline=None)
@given(data=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 9)), min_size=1, max_size=60))
def test_save_load_round_trip(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("rt")
    rows = np.array([(t, layer, e) for t, (layer, e) in enumerate(data)], dtype=np.int32)
    path = traces.save_trace(tmp / "x.npy", rows, {"num_experts": 10})
    tr = traces.load_trace(path)
    np.testing.assert_array_equal(tr.to_rows(), rows)
    assert tr.n_experts == 10 and sorted(p.name for p in tmp.iterdir()) == ["x.meta.json", "x.npy"]


def test_recorder_captures_rank_order_and_saves_atomically(tmp_path):
    rec = traces.TraceRecorder(meta={"model": "toy", "num_experts": 8})
    rec.record(1, np.array([[5, 2], [7, 0]]))  # layer 1 first: rows are re-sorted by layer
    rec.record(0, np.array([[3, 1], [4, 6]]))
    rec.step()
    rec.record(0, np.array([[2, 3]]))
    path = rec.save(tmp_path / "cap.npy")
    rows = np.load(path)
    assert rows.tolist() == [
        [0, 0, 3],
        [0, 0, 1],
        [0, 0, 4],
        [0, 0, 6],
        [0, 1, 5],
        [0, 1, 2],
        [0, 1, 7],
        [0, 1, 0],
        [1, 0, 2],
        [1, 0, 3],
    ]
    meta = json.loads((tmp_path / "cap.meta.json").read_text())
    assert meta["model"] == "toy" and meta["n_ticks"] == 2
    assert traces.load_trace(path).n_rows == 10
    assert not list(tmp_path.glob(".*tmp*"))


def test_split_cuts_at_a_tick_boundary():
    tr = synth.synthetic_trace(10, n_layers=2, n_experts=16, top_k=2, prefill_tokens=0, seed=1)
    a, b = tr.split(0.5)
    assert (a.n_ticks, b.n_ticks) == (5, 5) and a.ticks.max() < b.ticks.min()
    assert a.n_rows + b.n_rows == tr.n_rows


def test_synthetic_router_shapes_ranges_and_determinism():
    r1 = synth.SyntheticRouter(5, 32, 4, seed=7)
    r2 = synth.SyntheticRouter(5, 32, 4, seed=7)
    s1, s2 = r1.step(batch=3), r2.step(batch=3)
    assert s1.shape == (5, 3, 4) and s1.dtype == np.int32
    np.testing.assert_array_equal(s1, s2)
    assert s1.min() >= 0 and s1.max() < 32
    assert all(len(set(row)) == 4 for row in s1.reshape(-1, 4))  # top-k without repeats
    p = r1.prefill(64)
    assert p.shape == (5, 64, 4)
    assert len(np.unique(p[0])) > 24  # a prompt touches most experts of a layer
    other = synth.SyntheticRouter(5, 32, 4, seed=8).step(batch=3)
    assert not np.array_equal(other, s1)


def test_synthetic_decode_has_token_locality_and_skew():
    tr = synth.synthetic_trace(300, n_layers=4, n_experts=64, top_k=4, prefill_tokens=0, seed=0)
    keys = tr.keys.reshape(300, 16)
    reuse = np.mean([np.isin(keys[t + 1], keys[t]).mean() for t in range(299)])
    assert reuse > 3 * (4 / 64)  # well above chance
    counts = np.sort(np.bincount(tr.keys, minlength=tr.n_keys))[::-1]
    assert counts[: tr.n_keys // 10].sum() / counts.sum() > 0.2


def test_synthetic_router_rejects_bad_parameters():
    with pytest.raises(ConfigError, match="unknown parameter.*zipf"):
        synth.SyntheticRouter(2, 8, 2, zipff=1.0)
    with pytest.raises(ConfigError, match="top_k"):
        synth.SyntheticRouter(2, 8, 9)
    with pytest.raises(ConfigError, match="batch must be > 0"):
        synth.SyntheticRouter(2, 8, 2).step(0)

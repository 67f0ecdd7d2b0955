"""pack_build / pack_safetensors: the (H, I) rule, synthetic weights that decode, and
packs from tiny generated safetensors directories (float, HF names, NVFP4)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from tierstore import ConfigError, FormatError, Pack
from tierstore.format import fp4, layouts
from tierstore.format.build import build_synthetic
from tierstore.format.from_safetensors import build_from_safetensors
from tierstore.format.layouts import fit_expert_shape

H, I, E = 128, 64, 3


@settings(max_examples=60, deadline=None)
@given(tag=st.sampled_from(fp4.TAGS), hu=st.integers(1, 80), iu=st.integers(1, 80))
def test_fit_expert_shape_finds_an_exact_shape_for_every_expert_row_size(tag, hu, iu):
    slot = layouts.row_bytes(tag, 64 * hu, 64 * iu)
    got = fit_expert_shape(tag, slot)
    assert got is not None and layouts.row_bytes(tag, *got) == slot
    assert got[0] % 64 == 0 and got[1] % 64 == 0


def test_fit_expert_shape_picks_deepseek_ratio_and_rejects_non_fitting_sizes():
    assert fit_expert_shape("fp4", 13_369_344) == (4096, 2048)
    assert fit_expert_shape("base", 7_077_888) == (4096, 2048)
    assert fit_expert_shape("fp4", 65536) is None
    assert fit_expert_shape("fp4q", 7_864_320) is None


def test_synthetic_rows_decode_to_heavy_tailed_weights(tmp_path):
    path, layout = build_synthetic(str(tmp_path), 2, 4, layouts.row_bytes("fp4", 256, 128))
    assert layout.params == {"H": 256, "I": 128}
    with Pack.open(path) as p:
        rows = torch.from_numpy(np.stack([p.read_row(1, e) for e in range(4)]))
    w13, w2 = layouts.decode_expert(rows, "fp4", 256, 128)
    x = w13.flatten().double()
    kurtosis = ((x - x.mean()) ** 4).mean() / x.var() ** 2
    assert 0.01 < x.std() < 0.04 and kurtosis > 4.0  # Gaussian would be 3
    assert not torch.equal(w13[0], w13[1])  # experts differ


def test_synthetic_fragmajor_order_round_trips_through_the_codec(tmp_path):
    slot = layouts.row_bytes("fp4", 64, 64)
    lin, _ = build_synthetic(str(tmp_path / "a"), 1, 2, slot, seed=5)
    frag, lay = build_synthetic(str(tmp_path / "b"), 1, 2, slot, seed=5, order="fragmajor")
    assert lay.order == "fragmajor"
    with Pack.open(lin) as a, Pack.open(frag) as b:
        ra, rb = (torch.from_numpy(x.read_row(0, 1)) for x in (a, b))
        assert not torch.equal(ra, rb)
        da = layouts.decode_expert(ra, "fp4", 64, 64)
        db = layouts.decode_expert(rb, "fp4", 64, 64, order="fragmajor")
        assert torch.equal(da[0], db[0]) and torch.equal(da[1], db[1])


def _weights(seed=0, layers=(3, 4)):
    g = torch.Generator().manual_seed(seed)
    return {
        (l, e): (torch.randn(2 * I, H, generator=g), torch.randn(H, I, generator=g))
        for l in layers
        for e in range(E)
    }


def _save(d, tensors, name="model.safetensors"):
    os.makedirs(d, exist_ok=True)
    save_file(tensors, os.path.join(d, name))


def _expected_rows(w, layer):
    a = torch.stack([w[layer, e][0] for e in range(E)])
    b = torch.stack([w[layer, e][1] for e in range(E)])
    return layouts.encode_experts(a, b, "fp4")


def test_fused_names_in_two_files_build_rows_equal_to_the_codec(tmp_path):
    w = _weights()
    src = tmp_path / "ck"
    _save(src, {f"layers.{l}.experts.{e}.w13": a.bfloat16() for (l, e), (a, _) in w.items()}, "a.safetensors")
    _save(
        src,
        {f"layers.{l}.experts.{e}.w2": b.bfloat16() for (l, e), (_, b) in w.items()}
        | {"layers.3.attn.wq": torch.zeros(4, 4)},
        "b.safetensors",
    )
    path, layout = build_from_safetensors(str(tmp_path / "out"), str(src))
    wb = {k: (a.bfloat16().float(), b.bfloat16().float()) for k, (a, b) in w.items()}
    with Pack.open(path) as p:
        assert (p.n_layers, p.n_experts, p.slot_bytes) == (2, E, layouts.row_bytes("fp4", H, I))
        assert p.identity["ckpt_id"].startswith("safetensors-xxh3_128:")
        want = _expected_rows(wb, 4)
        for e in range(E):
            assert np.array_equal(p.read_row(1, e), want[e])
        p.verify()


def test_hf_gate_up_down_names_fp16(tmp_path):
    w = _weights(layers=(7,))
    t = {}
    for (l, e), (a, b) in w.items():
        pre = f"model.layers.{l}.mlp.experts.{e}"
        t[f"{pre}.gate_proj.weight"] = a[:I].half()
        t[f"{pre}.up_proj.weight"] = a[I:].half()
        t[f"{pre}.down_proj.weight"] = b.half()
    _save(tmp_path / "ck", t)
    path, _ = build_from_safetensors(str(tmp_path / "out"), str(tmp_path / "ck"))
    wh = {k: (a.half().float(), b.half().float()) for k, (a, b) in w.items()}
    with Pack.open(path) as p:
        assert np.array_equal(p.read_row(0, 2), _expected_rows(wh, 7)[2])


def test_nvfp4_tensors_are_requantised_to_mxfp4(tmp_path):
    w = _weights(layers=(0,))
    t, dec = {}, {}
    for (l, e), (a, b) in w.items():
        for name, m in (("w13", a), ("w2", b)):
            q, s, g = fp4.quantize_nvfp4(m)
            key = f"layers.{l}.experts.{e}.{name}"
            t[f"{key}.weight"], t[f"{key}.weight_scale"] = q, s
            t[f"{key}.weight_scale_2"] = torch.tensor([g], dtype=torch.float32)
            dec[l, e, name] = fp4.dequantize_nvfp4(q, s, g)
    _save(tmp_path / "ck", t)
    path, _ = build_from_safetensors(str(tmp_path / "out"), str(tmp_path / "ck"))
    with Pack.open(path) as p:
        assert "from-nvfp4" in p.identity["quantizer_abi"]
        want = layouts.encode_expert(dec[0, 1, "w13"], dec[0, 1, "w2"])
        assert np.array_equal(p.read_row(0, 1), want)
    with pytest.raises(FormatError, match="NVFP4 tensors found but --format mxfp4"):
        build_from_safetensors(str(tmp_path / "out2"), str(tmp_path / "ck"), fmt="mxfp4")


def test_missing_expert_is_named(tmp_path):
    w = _weights()
    t = {f"layers.{l}.experts.{e}.w13": a for (l, e), (a, _) in w.items()}
    t |= {f"layers.{l}.experts.{e}.w2": b for (l, e), (_, b) in w.items() if (l, e) != (4, 1)}
    del t["layers.4.experts.1.w13"]
    _save(tmp_path / "ck", t)
    with pytest.raises(FormatError, match=r"layer 4: experts \[1\] missing"):
        build_from_safetensors(str(tmp_path / "out"), str(tmp_path / "ck"))
    assert not os.path.exists(tmp_path / "out")


def test_missing_w2_wrong_shape_and_dtype_are_named(tmp_path):
    w = _weights(layers=(0,))
    base = {f"layers.0.experts.{e}.w13": a for (_, e), (a, _) in w.items()}
    _save(tmp_path / "a", base)
    with pytest.raises(FormatError, match=r"layer 0 expert 0: missing w2"):
        build_from_safetensors(str(tmp_path / "out"), str(tmp_path / "a"))
    t = base | {f"layers.0.experts.{e}.w2": b for (_, e), (_, b) in w.items()}
    t["layers.0.experts.2.w2"] = torch.zeros(H, I + 64)
    _save(tmp_path / "b", t)
    with pytest.raises(
        FormatError,
        match=r"layer 0 expert 2: w13 \[128, 128\], w2 \[128, 128\]; "
        r"expected \[128, 128\] and \[128, 64\]",
    ):
        build_from_safetensors(str(tmp_path / "out"), str(tmp_path / "b"))
    t["layers.0.experts.2.w2"] = torch.zeros(H, I, dtype=torch.int32)
    _save(tmp_path / "c", t)
    with pytest.raises(FormatError, match=r"layers.0.experts.2.w2: dtype torch.int32"):
        build_from_safetensors(str(tmp_path / "out"), str(tmp_path / "c"))


def test_directory_without_experts_or_safetensors_is_rejected(tmp_path):
    _save(tmp_path / "a", {"embed.weight": torch.zeros(4, 4)})
    with pytest.raises(FormatError, match="no expert weights found; accepted names"):
        build_from_safetensors(str(tmp_path / "out"), str(tmp_path / "a"))
    os.makedirs(tmp_path / "b")
    with pytest.raises(FormatError, match="no .safetensors files"):
        build_from_safetensors(str(tmp_path / "out"), str(tmp_path / "b"))
    (tmp_path / "b" / "x.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{bad")
    with pytest.raises(FormatError, match="x.safetensors: not a readable safetensors file"):
        build_from_safetensors(str(tmp_path / "out"), str(tmp_path / "b"))


def test_bad_format_name_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="--format 'int4'"):
        build_synthetic(str(tmp_path), 1, 1, 4096, fmt="int4")

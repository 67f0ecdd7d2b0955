"""--quantization tierstore against vLLM 0.34's real classes, on CPU.

Layers are built by vLLM's own FusedMoEFactory (MoERunner -> RoutedExperts ->
our method), loaded through RoutedExperts.load_weights (vLLM's own loader loop),
routed by vLLM's router and compared with the torch reference. CI installs the
vLLM wheel (.ci/vllm-requirements.txt) and sets TIERSTORE_TEST_REQUIRE_VLLM=1, so these
fail there instead of skipping."""

from __future__ import annotations

import os

import pytest
import tomllib
import torch
from vllm_layer_helpers import build_layers, checkpoint_weights, layer_forward, need_vllm, route

from tierstore.adapters import vllm_quant
from tierstore.adapters.vllm_pack import ExpertCapture, decode_part
from tierstore.compute.moe import dense_moe, fused_moe_reference
from tierstore.format.pack import Pack
from tierstore.testing.model import make_moe_model

E, H, I, K = 8, 64, 64, 2
# transformer layers 0 and 2 are dense: MoE rows 0, 1 are transformer layers 1, 3
PREFIXES = ("model.layers.1.mlp.experts", "model.layers.3.mlp.experts")


@pytest.fixture(scope="module")
def vllm_present():
    need_vllm()
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model(vllm_present):
    return make_moe_model(len(PREFIXES), E, H, I, seed=3)


def runtime(d, *, slots: int = 64, ckpt="ckpt-a", inner=None):
    from tierstore.format import layouts

    env = {
        "dir": None,
        "vram_gb": slots * layouts.row_bytes("fp4", H, I) / 2**30,
        "ram_gb": 0.0,
        "prefill_tokens": 16,
        "mode": "tiered",
    }
    rt = vllm_quant.Runtime(pack_dir=str(d), ckpt_id=ckpt, n_layers=4, device="cpu", env=env)
    return vllm_quant.config_class()(inner, rt), rt


def boot(d, model, fmt="bf16", **kw):
    """Build, load (vLLM's loader) and post-process both MoE layers: one vLLM boot."""
    qc, rt = runtime(d, **kw)
    runners = build_layers(qc, PREFIXES, E=E, H=H, I=I, top_k=K)
    for i, r in enumerate(runners):
        loaded = list(r.routed_experts.load_weights(checkpoint_weights(model, i, fmt)))
        assert len(loaded) == len(checkpoint_weights(model, i, fmt))
    for r in runners:
        r.routed_experts.quant_method.process_weights_after_loading(r.routed_experts)
    return runners, rt


def test_registered_name_and_entry_point(vllm_present):
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, get_quantization_config

    from tierstore import settings

    with settings.override(metrics=False):  # register() would point this process's
        cls = vllm_quant.register()  # stores at a scrape directory (a server's)
    assert "tierstore" in QUANTIZATION_METHODS and get_quantization_config("tierstore") is cls
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        eps = tomllib.load(f)["project"]["entry-points"]["vllm.general_plugins"]
    assert eps["tierstore"] == "tierstore.adapters.vllm_quant:register"
    assert cls.override_quantization_method({"quant_method": "fp8"}, "tierstore") == "tierstore"
    assert cls.override_quantization_method({"quant_method": "fp8"}, None) is None


def test_factory_layers_get_moe_order_rows_placeholders_and_no_module_cycle(tmp_path, vllm_present):
    qc, rt = runtime(tmp_path)
    runners = build_layers(qc, PREFIXES, E=E, H=H, I=I, top_k=K)
    assert rt.indices == {PREFIXES[0]: 0, PREFIXES[1]: 1}
    for i, r in enumerate(runners):
        layer = r.routed_experts
        method = layer.quant_method
        assert type(method).__name__ == "TierstoreVllmMoEMethod"
        assert not isinstance(method, torch.nn.Module) and method.requires_device_loading is False
        assert method.layer_index == i and layer.tierstore_layer_index == i
        assert layer.w13_weight.numel() == 0 and layer.w2_weight.numel() == 0
        names = [n for n, _ in r.named_modules()]  # finite: no cycle
        assert len(names) == len(set(names))
        r.state_dict()
        layer._replace_quant_method(method)  # plain assignment, no TypeError


def test_first_boot_writes_packs_then_forward_matches_the_torch_reference(tmp_path, model):
    runners, rt = boot(tmp_path, model)
    tier = rt.tier
    fp4 = Pack.open(tier.packs["fp4"])
    assert fp4.n_layers == 4 and list(fp4.layers) == [0, 1]  # MoE order, bound 4
    tier.finalize()
    for i, r in enumerate(runners):
        x = model.tokens(5, seed=i).to(torch.bfloat16)
        logits = x.float() @ model.router[i]
        w, ids = route(r, x, logits)
        got = layer_forward(r, x, logits)
        assert got.shape == (5, H) and got.dtype == x.dtype
        ref = fused_moe_reference(x, w, ids, i, tier.store, tier.base, torch.float64)
        torch.testing.assert_close(got.double(), ref, rtol=2e-2, atol=2e-2)
        dense = dense_moe(x.float(), w.float(), ids, model.w13[i], model.w2[i])
        base_err = float((got.double() - dense).norm() / dense.norm())
        tier.store.promote([(i, e) for e in range(E)]).wait()  # read (publish="step")...
        tier.store.step()  # ...every expert in the pool
        fp4_out = layer_forward(r, x, logits).double()
        fp4_err = float((fp4_out - dense).norm() / dense.norm())
        assert fp4_err < 0.35 and fp4_err < 0.5 * base_err, (fp4_err, base_err)
    tier.shutdown()


def test_second_boot_skips_loading_experts_and_serves_the_same_rows(tmp_path, model):
    first, rt1 = boot(tmp_path, model)
    rt1.tier.shutdown()
    qc, rt = runtime(tmp_path)
    runners = build_layers(qc, PREFIXES, E=E, H=H, I=I, top_k=K)
    for i, r in enumerate(runners):
        assert r.routed_experts.w13_weight.weight_loader.__name__ == "_drop"
        list(r.routed_experts.load_weights(checkpoint_weights(model, i)))
    assert rt.capture.pending() == {}  # nothing kept: loader-skip
    r = runners[0]
    r.routed_experts.quant_method.process_weights_after_loading(r.routed_experts)
    x = model.tokens(3, seed=9).to(torch.bfloat16)
    logits = x.float() @ model.router[0]
    torch.testing.assert_close(layer_forward(r, x, logits), layer_forward(first[0], x, logits))
    rt.tier.shutdown()


def test_another_checkpoint_identity_gets_its_own_packs(tmp_path, model):
    _, a = boot(tmp_path, model, ckpt="ckpt-a")
    _, b = boot(tmp_path, model, ckpt="ckpt-b")
    assert a.tier.packs["fp4"] != b.tier.packs["fp4"]
    a.tier.shutdown(), b.tier.shutdown()


def test_interrupted_first_boot_resumes_with_the_missing_layer_only(tmp_path, model):
    qc, rt = runtime(tmp_path)
    runners = build_layers(qc, PREFIXES, E=E, H=H, I=I, top_k=K)
    list(runners[0].routed_experts.load_weights(checkpoint_weights(model, 0)))
    rt.capture.close()  # the process dies here
    qc2, rt2 = runtime(tmp_path)
    again = build_layers(qc2, PREFIXES, E=E, H=H, I=I, top_k=K)
    assert again[0].routed_experts.w13_weight.weight_loader.__name__ == "_drop"
    assert again[1].routed_experts.w13_weight.weight_loader.__name__ != "_drop"
    list(again[1].routed_experts.load_weights(checkpoint_weights(model, 1)))
    again[1].routed_experts.quant_method.process_weights_after_loading(again[1].routed_experts)
    assert list(Pack.open(rt2.tier.packs["base"]).layers) == [0, 1]
    rt2.tier.shutdown()


def test_incomplete_checkpoint_is_one_config_error_naming_the_layers(tmp_path, model):
    from tierstore.errors import ConfigError

    qc, rt = runtime(tmp_path)
    runners = build_layers(qc, PREFIXES, E=E, H=H, I=I, top_k=K)
    list(runners[0].routed_experts.load_weights(checkpoint_weights(model, 0)))
    with pytest.raises(ConfigError, match=r"MoE layers \[1\] have no pack rows"):
        runners[1].routed_experts.quant_method.process_weights_after_loading(runners[1])


# error vs the float weights, relative to MXFP4-encoding the float weights directly
@pytest.mark.parametrize("fmt, factor", [("fp8", 1.2), ("mxfp4", 1.0001), ("nvfp4", 1.6)])
def test_quantized_checkpoints_load_their_scales_and_decode(tmp_path, model, fmt, factor):
    """FP8 (block scale_inv), MXFP4 and NVFP4 tensors reach the capture through the
    placeholders of the checkpoint's own method (or, where that method cannot be
    built on the meta device, every known expert parameter name)."""
    qc, rt = runtime(tmp_path, inner=inner_config(fmt))
    runners = build_layers(qc, PREFIXES, E=E, H=H, I=I, top_k=K)
    for i, r in enumerate(runners):
        list(r.routed_experts.load_weights(checkpoint_weights(model, i, fmt)))
    runners[0].routed_experts.quant_method.process_weights_after_loading(runners[0])
    from tierstore.format.layouts import decode_expert

    pack = Pack.open(rt.tier.packs["fp4"])
    got = decode_expert(pack.read_row(1, 5), "fp4", H, I)
    direct = decode_expert(model.fp4_rows[1][5], "fp4", H, I)
    for g, d, want in zip(got, direct, (model.w13[1][5], model.w2[1][5])):
        err = float((g.float() - want).norm() / want.norm())
        floor = float((d.float() - want).norm() / want.norm())
        assert err <= factor * floor, (err, floor)
    rt.tier.shutdown()


def inner_config(fmt):
    """The checkpoint's own vLLM config, as from_config builds it from config.json."""
    from vllm.model_executor.layers.quantization import get_quantization_config

    cfg = {
        "fp8": {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [32, 32]},
        "mxfp4": {"quant_method": "mxfp4"},
        "nvfp4": {
            "quant_method": "modelopt_fp4",
            "quant_algo": "NVFP4",
            "quantization": {
                "quant_algo": "NVFP4",
                "group_size": 16,
                "kv_cache_quant_algo": None,
                "exclude_modules": [],
            },
        },
    }[fmt]
    return get_quantization_config(cfg["quant_method"]).from_config(cfg)


def test_fp8_block_scale_decodes_like_a_dequantize():
    w = torch.randn(64, 96)
    s = torch.rand(2, 3) + 0.5
    q = (w / s.repeat_interleave(32, 0).repeat_interleave(32, 1)).to(torch.float8_e4m3fn)
    got = decode_part({"weight": q, "weight_scale_inv": s}, "t")
    want = q.float() * s.repeat_interleave(32, 0).repeat_interleave(32, 1)
    torch.testing.assert_close(got, want)


def test_capture_refuses_fused_or_unsharded_tensors(tmp_path):
    from tierstore.errors import ConfigError

    cap = ExpertCapture(str(tmp_path), ckpt_id="x", n_layers=1, n_experts=E, H=H, I=I)
    with pytest.raises(ConfigError, match="per-expert tensors"):
        cap.take(0, "w13", "weight", torch.zeros(2 * I, H), None, None)
    cap.close()


def test_worker_cls_resolves_through_vllm_and_finds_the_tier(tmp_path, model):
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.worker.gpu_worker import Worker

    from tierstore.adapters import vllm_worker

    cls = resolve_obj_by_qualname("tierstore.adapters.vllm_worker.TierstoreWorker")
    assert issubclass(cls, Worker) and cls is vllm_worker.worker_class()
    runners, rt = boot(tmp_path, model)
    model_modules = torch.nn.ModuleList(runners)
    assert vllm_worker.model_tiers(model_modules) == [rt.tier]
    tier = rt.tier
    x = model.tokens(2, seed=4).to(torch.bfloat16)
    layer_forward(runners[1], x, x.float() @ model.router[1])  # before finalize: base rows
    tier.finalize()
    pool, table = tier.store.pool, tier.store.slot_table
    with tier.quiet():
        tier.step_end()  # quiet: queues nothing
    assert int(tier.seen[1].sum()) > 0
    tier.step_end()  # folds seen into the store
    assert int(tier.seen.sum()) == 0 and tier.store.step_count >= 1
    tier.finalize()  # once: same tensors
    assert tier.store.pool is pool and tier.store.slot_table is table
    tier.shutdown()

"""The registered config against vLLM 0.34's real classes (CPU, no engine): it pickles
(vLLM sends it to its engine core and workers), gives every linear layer stock's method,
and the exact-mode pieces that need no engine (pack layout, pool sizing, settings)."""

from __future__ import annotations

import pickle

import pytest
import torch
from vllm_layer_helpers import need_vllm

from tierstore.adapters import vllm_exact, vllm_quant
from tierstore.errors import ConfigError


def env(**kw):
    return vllm_quant.ENV.parse({}) | kw


def test_config_pickles_without_its_runtime():
    need_vllm()
    cls = vllm_quant.config_class()
    assert cls.__module__ == "tierstore.adapters.vllm_config"  # importable by qualname
    rt = vllm_quant.Runtime(env=env())
    rt.moe_index("model.layers.0.mlp.experts")
    cfg = pickle.loads(pickle.dumps(cls(None, rt)))
    assert type(cfg) is cls and cfg.runtime is not rt and cfg.runtime.indices == {}
    assert cfg.get_name() == "tierstore"


def test_unquantized_linear_layers_get_vllms_unquantized_method():
    need_vllm()
    from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod

    cfg = vllm_quant.config_class()(None, vllm_quant.Runtime(env=env()))
    layer = LinearBase.__new__(LinearBase)
    assert isinstance(
        cfg.get_quant_method(layer, "model.layers.0.self_attn.qkv_proj"), UnquantizedLinearMethod
    )
    assert cfg.get_quant_method(torch.nn.Module(), "model.norm") is None


def test_planes_become_rows_and_back_byte_exact():
    E = 5
    w13 = torch.randn(E, 8, 16, dtype=torch.bfloat16)
    w2 = torch.randn(E, 16, 4, dtype=torch.bfloat16)
    scale = torch.rand(E, 3, dtype=torch.float32)
    layer = torch.nn.Module()
    for name, t in (("w13_weight", w13), ("w2_weight", w2), ("w13_weight_scale", scale)):
        layer.register_parameter(name, torch.nn.Parameter(t, requires_grad=False))
    planes = vllm_exact.expert_planes(layer, E, "layer 0", {"w13_weight", "w2_weight", "w13_weight_scale"})
    layout = vllm_exact.plane_layout(planes)
    assert all(p.offset % vllm_exact.PLANE_ALIGN == 0 for p in layout)
    rows = vllm_exact.rows_of(planes, layout)
    assert rows.shape == (E, vllm_exact.row_bytes_of(layout))
    for (name, t), p in zip(planes, layout):
        back = torch.from_numpy(rows[:, p.offset : p.offset + p.nbytes].copy()).view(t.dtype)
        assert torch.equal(back.view(t.shape), t.detach()), name


def test_a_method_parameter_that_is_not_per_expert_is_refused_by_name():
    layer = torch.nn.Module()
    layer.register_parameter("w13_weight", torch.nn.Parameter(torch.zeros(4, 2, 2), requires_grad=False))
    layer.register_parameter("w13_input_scale", torch.nn.Parameter(torch.ones(3), requires_grad=False))
    with pytest.raises(ConfigError, match="w13_input_scale"):
        vllm_exact.expert_planes(layer, 4, "layer 2", {"w13_weight", "w13_input_scale"})
    # a router's parameter on the same layer is not the method's: ignored
    assert [n for n, _ in vllm_exact.expert_planes(layer, 4, "layer 2", {"w13_weight"})] == ["w13_weight"]


@pytest.mark.parametrize(
    "setting, want", [("all", 96), ("floor", 16), ("50%", 48), ("12.5%", 12), (40, 40), ("auto", 96)]
)
def test_pool_slots(setting, want):
    assert (
        vllm_exact.pool_slots(setting, n_moe_layers=6, n_experts=16, slot_bytes=1 << 20, device="cpu") == want
    )


@pytest.mark.parametrize("value", ["lots", "0", "-3", "0%", "101%", "nan%", "1.5", ""])
def test_bad_slots_settings_are_config_errors_naming_the_variable(value):
    with pytest.raises(ConfigError, match="TIERSTORE_VLLM_SLOTS"):
        vllm_quant.ENV.parse({"TIERSTORE_VLLM_SLOTS": value})


def test_check_settings_is_one_line_and_silent_when_unset(tmp_path):
    vllm_quant.check_settings({})  # nothing set: nothing checked, nothing raised
    with pytest.raises(SystemExit) as info:
        vllm_quant.check_settings({"TIERSTORE_VLLM_MODE": "fast"})
    msg = str(info.value)
    assert msg.startswith("tierstore: TIERSTORE_VLLM_MODE=fast") and "\n" not in msg
    vllm_quant.check_settings({"TIERSTORE_VLLM_DIR": str(tmp_path / "new" / "dir")})


def test_exact_tier_refuses_a_pool_under_the_floor(tmp_path):
    from tierstore.format.writer import PackWriter

    E = 4
    layer = torch.nn.Module()
    layer.register_parameter(
        "w13_weight", torch.nn.Parameter(torch.randn(E, 4, 8, dtype=torch.bfloat16), requires_grad=False)
    )
    planes = vllm_exact.expert_planes(layer, E, "l0", {"w13_weight"})
    layout = vllm_exact.plane_layout(planes)
    with PackWriter(
        str(tmp_path),
        tag="exact",
        n_layers=1,
        n_experts=E,
        slot_bytes=vllm_exact.row_bytes_of(layout),
        ckpt_id="t",
        layout=vllm_exact.layout_sections(layout),
    ) as w:
        w.write_layer(0, vllm_exact.rows_of(planes, layout))
        path = w.path
    with pytest.raises(ConfigError, match="under the floor of 4"):
        vllm_exact.ExactTier(path, slots=3, device="cpu")
    tier = vllm_exact.ExactTier(path, slots=4, device="cpu")
    try:
        target = torch.nn.Module()
        target.register_parameter(
            "w13_weight", torch.nn.Parameter(torch.empty(0, 4, 8, dtype=torch.bfloat16), requires_grad=False)
        )
        tier.adopt(target, "l0")
        assert target.w13_weight.data_ptr() == tier.scratch["w13_weight"].data_ptr()

        class Inner:  # what vLLM's method reads: the layer's planes at the routed ids
            def apply(self, layer, x, w, ids, *_):
                return layer.w13_weight[ids.long()].float().sum(dim=(1, 2, 3))[:, None] * x

        ids = torch.tensor([[3, 1], [1, 2]], dtype=torch.int32)
        out = tier.forward(0, target, Inner(), torch.ones(2, 1), torch.ones(2, 2), ids)
        want = planes[0][1][ids.long()].float().sum(dim=(1, 2, 3))[:, None]
        assert torch.equal(out, want)
        stats = tier.store.stats()
        assert stats.pool.pinned == 0 and stats.pool.resident == 3  # released after the call
    finally:
        tier.close()


def test_exact_tier_captures_the_routing_it_serves_step_by_step(tmp_path):
    from tierstore import settings
    from tierstore.format.writer import PackWriter
    from tierstore.sim.traces import load_trace

    E, L = 4, 2
    layer = torch.nn.Module()
    layer.register_parameter(
        "w13_weight", torch.nn.Parameter(torch.randn(E, 4, 8, dtype=torch.bfloat16), requires_grad=False)
    )
    planes = vllm_exact.expert_planes(layer, E, "l0", {"w13_weight"})
    layout = vllm_exact.plane_layout(planes)
    with PackWriter(
        str(tmp_path),
        tag="exact",
        n_layers=L,
        n_experts=E,
        slot_bytes=vllm_exact.row_bytes_of(layout),
        ckpt_id="t",
        layout=vllm_exact.layout_sections(layout),
    ) as w:
        for l in range(L):
            w.write_layer(l, vllm_exact.rows_of(planes, layout))
        path = w.path

    class Inner:
        def apply(self, layer, x, w, ids, *_):
            return x

    out = tmp_path / "routing.npy"
    with settings.override(capture=str(out)):
        tier = vllm_exact.ExactTier(path, slots=8, device="cpu")
    target = torch.nn.Module()
    target.register_parameter(
        "w13_weight", torch.nn.Parameter(torch.empty(0, 4, 8, dtype=torch.bfloat16), requires_grad=False)
    )
    tier.adopt(target, "l0")
    steps = [[[0, 1], [2, 1]], [[3, 3]]]
    for step in steps:  # two engine steps, both layers each
        for l in range(L):
            ids = torch.tensor(step, dtype=torch.int32)
            tier.forward(l, target, Inner(), torch.ones(len(step), 1), None, ids)
    tier.capture.step()  # the engine's last step ends
    tier.close()
    trace = load_trace(str(out))
    assert len(trace.ticks) == 2 * (4 + 2) and trace.n_experts == E
    assert sorted(set(trace.ticks.tolist())) == [0, 1]
    assert sorted(trace.experts[trace.ticks == 1].tolist()) == [3, 3, 3, 3]
    assert trace.meta["mode"] == "exact"


def test_exact_tier_under_expert_parallelism_hands_stocks_kernel_a_map_to_scratch(tmp_path):
    """Under EP vLLM's kernel takes global ids and layer.expert_map (global -> local, -1 on
    another rank). The tier keeps the ids global and, for the call, points the map at the
    scratch rows of this rank's fired experts; the map is restored after."""
    from tierstore.format.writer import PackWriter

    E_global, E_local, rank = 8, 4, 1
    full = torch.randn(E_global, 4, 8, dtype=torch.bfloat16)
    mine = full[rank * E_local : (rank + 1) * E_local]  # linear placement
    layer = torch.nn.Module()
    layer.register_parameter("w13_weight", torch.nn.Parameter(mine.clone(), requires_grad=False))
    planes = vllm_exact.expert_planes(layer, E_local, "l0", {"w13_weight"})
    layout = vllm_exact.plane_layout(planes)
    with PackWriter(
        str(tmp_path),
        tag="exact",
        n_layers=1,
        n_experts=E_local,
        slot_bytes=vllm_exact.row_bytes_of(layout),
        ckpt_id="t",
        layout=vllm_exact.layout_sections(layout),
        rank=rank,
        world=2,
    ) as w:
        w.write_layer(0, vllm_exact.rows_of(planes, layout))
        path = w.path
    emap = torch.full((E_global,), -1, dtype=torch.int32)
    emap[rank * E_local : (rank + 1) * E_local] = torch.arange(E_local, dtype=torch.int32)

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_parameter(
                "w13_weight",
                torch.nn.Parameter(torch.empty(0, 4, 8, dtype=torch.bfloat16), requires_grad=False),
            )
            self.register_buffer("_expert_map", emap.clone())

        @property
        def expert_map(self):
            return self._expert_map

    class StockKernel:  # what vLLM's kernels do with an expert_map
        def apply(self, layer, x, w, ids, *_):
            local = layer.expert_map[ids.long()]
            val = layer.w13_weight.float().sum(dim=(1, 2))[local.clamp(min=0).long()]
            return (w * torch.where(local >= 0, val, torch.zeros_like(val))).sum(1, keepdim=True)

    target = Layer()
    tier = vllm_exact.ExactTier(path, slots=4, device="cpu")
    try:
        tier.adopt(target, "l0", target.expert_map.clone())
        ids = torch.tensor([[0, 5], [7, 6], [1, 2]], dtype=torch.int32)  # 5, 6, 7 are here
        w = torch.tensor([[0.5, 0.25], [1.0, 2.0], [3.0, 4.0]])
        out = tier.forward(0, target, StockKernel(), torch.ones(3, 1), w, ids)
        here = (ids >= rank * E_local) & (ids < (rank + 1) * E_local)
        vals = full.float().sum(dim=(1, 2))[ids.long()]
        want = (w * torch.where(here, vals, torch.zeros_like(vals))).sum(1, keepdim=True)
        assert torch.equal(out, want)
        assert torch.equal(target.expert_map, emap)  # restored
        assert sorted(map(tuple, tier.store.resident_keys().tolist())) == [(0, 1), (0, 2), (0, 3)]
    finally:
        tier.close()

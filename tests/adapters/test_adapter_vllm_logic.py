"""The upstream-vLLM quant method's logic, run without vLLM on a real MoetTier."""

from __future__ import annotations

import pytest
import torch
from adapter_helpers import E, H, I, L, make_tier, model_and_dir, one_torch_thread  # noqa: F401

from tierstore.adapters.vllm import TierstoreMoEMethodLogic, check_geometry, routed_forward
from tierstore.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def tier():
    t = make_tier(model_and_dir()[1], slots=24)
    yield t
    t.shutdown()


def test_create_weights_registers_placeholders_that_drop_checkpoint_tensors(tier):
    layer = torch.nn.Module()
    TierstoreMoEMethodLogic(tier, 1).create_weights(layer, E, H, I, torch.bfloat16)
    assert layer.w13_weight.numel() == 0 and layer.w2_weight.dtype == torch.bfloat16
    assert (
        layer.w2_weight.weight_loader(
            param=layer.w2_weight,
            loaded_weight=torch.ones(H, I),
            weight_name="w2_weight",
            shard_id="w2",
            expert_id=3,
            return_success=True,
        )
        is True
    )
    assert layer.tierstore_layer_index == 1


@pytest.mark.parametrize(
    "args, needle",
    [
        ((E + 1, H, I), f"num_experts {E + 1}, expected {E}"),
        ((E, 2 * H, I), f"hidden_size {2 * H}, expected {H}"),
        ((E, H, I // 2), f"intermediate_size {I // 2}, expected {I}"),
    ],
)
def test_geometry_mismatch_names_the_layer_and_values(tier, args, needle):
    with pytest.raises(ConfigError, match=rf"vLLM MoE layer 2 does not match .*{needle}"):
        TierstoreMoEMethodLogic(tier, 2).create_weights(torch.nn.Module(), *args, torch.float32)


def test_layer_index_out_of_the_pack_is_refused(tier):
    with pytest.raises(ConfigError, match=rf"layer index {L}, expected 0..{L - 1}"):
        check_geometry(tier, L, E, H, I)


def test_apply_marks_seen_and_returns_the_tier_forward(tier):
    model = model_and_dir()[0]
    x = model.tokens(3, seed=4)
    w, ids = model.route(x, 0, 2)
    method = TierstoreMoEMethodLogic(tier, 0)
    assert method.get_fused_moe_quant_config(None) is None
    out = method.apply(torch.nn.Module(), x, w, ids, None, None)
    torch.testing.assert_close(out, tier.moe_w2_forward(x, w, ids, 0))
    assert sorted(tier.seen_pairs()[:, 1].tolist()) == sorted(torch.unique(ids).tolist())
    assert int((tier.store.slot_table >= 0).sum()) == 0  # decode-sized: no prefill promotion


def test_prefill_sized_apply_makes_the_experts_resident_first(tier):
    model = model_and_dir()[0]
    x = model.tokens(20, seed=5)
    w, ids = model.route(x, 1, 2)
    routed_forward(tier, 1, x, w, ids, prefill_tokens=16)
    for e in torch.unique(ids).tolist():
        assert int(tier.store.slot_table[1, e]) >= 0
    tier.step_end()


def test_expert_map_routes_only_this_ranks_experts(tier):
    model = model_and_dir()[0]
    x = model.tokens(2, seed=6)
    # global experts 0..2E-1, this rank holds the odd ones as local 0..E-1
    expert_map = torch.full((2 * E,), -1, dtype=torch.int64)
    expert_map[1::2] = torch.arange(E)
    gids = torch.tensor([[1, 4], [6, 3]], dtype=torch.int32)
    w = torch.tensor([[0.75, 0.25], [0.5, 0.5]])
    got = routed_forward(tier, 0, x, w, gids, expert_map=expert_map)
    local = torch.tensor([[0, 0], [0, 1]], dtype=torch.int32)
    want = tier.moe_w2_forward(x, torch.tensor([[0.75, 0.0], [0.0, 0.5]]), local, 0)
    torch.testing.assert_close(got, want)

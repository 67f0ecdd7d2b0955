"""The upstream-vLLM hook: vLLM-free behaviour always, vLLM's signatures when importable."""

from __future__ import annotations

import inspect

import pytest
import torch
from vllm_layer_helpers import REQUIRE, need_vllm

from tierstore.adapters import vllm as hook
from tierstore.errors import ConfigError

# what tierstore.adapters.vllm relies on, in vLLM 0.34.0 (hook.VLLM_VERSION)
EXPECTED = {
    "FusedMoEMethodBase.__init__": ["self", "moe"],
    "FusedMoEMethodBase.create_weights": [
        "self",
        "layer",
        "num_experts",
        "hidden_size",
        "intermediate_size_per_partition",
        "params_dtype",
        "extra_weight_attrs",
    ],
    "FusedMoEMethodBase.get_fused_moe_quant_config": ["self", "layer"],
    "FusedMoEMethodBase.process_weights_after_loading": ["self", "layer"],
    "FusedMoEMethodBase.apply": [
        "self",
        "layer",
        "x",
        "topk_weights",
        "topk_ids",
        "shared_experts",
        "shared_experts_input",
    ],
    "RoutedExperts._replace_quant_method": ["self", "quant_method"],
    "RoutedExperts.weight_loader": [
        "self",
        "param",
        "loaded_weight",
        "weight_name",
        "shard_id",
        "expert_id",
        "return_success",
    ],
}


@pytest.mark.parametrize("qualname", sorted(EXPECTED))
def test_vllm_signature_matches_the_pinned_contract(qualname):
    need_vllm()
    names = hook.vllm_names()
    cls_name, meth = qualname.split(".")
    params = list(inspect.signature(getattr(names[cls_name], meth)).parameters)
    assert params == EXPECTED[qualname], f"vLLM {qualname} changed (hook targets {hook.VLLM_VERSION})"


def test_installed_vllm_is_the_pinned_version():
    need_vllm()
    import vllm

    assert vllm.__version__.split("+")[0] == hook.VLLM_VERSION


@pytest.mark.skipif(hook.vllm_available() or REQUIRE, reason="vLLM is installed")
def test_vllm_backed_names_without_vllm_raise_one_clear_config_error():
    hook.method_class.cache_clear()
    with pytest.raises(ConfigError, match=rf"needs vLLM.*install vllm=={hook.VLLM_VERSION}"):
        hook.method_class()
    with pytest.raises(ConfigError, match="needs vLLM"):
        hook.install(torch.nn.Linear(2, 2), tier=None)


@pytest.mark.parametrize(
    "name, index",
    [
        ("model.layers.0.mlp.experts", 0),
        ("model.layers.42.mlp.experts", 42),
        ("language_model.model.layers.7.block_sparse_moe", 7),
        ("layers.3", 3),
    ],
)
def test_layer_index_comes_from_the_layer_name(name, index):
    assert hook.layer_index_from_name(name) == index


def test_layer_name_without_a_number_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match="'model.mtp.experts'"):
        hook.layer_index_from_name("model.mtp.experts")


def test_expert_map_zeroes_pairs_of_other_ranks_and_keeps_shapes():
    expert_map = torch.tensor([-1, -1, 0, 1])  # this rank holds global experts 2, 3
    w = torch.tensor([[0.5, 0.25], [0.75, 0.125]])
    ids = torch.tensor([[2, 0], [1, 3]], dtype=torch.int32)
    lw, lid = hook.to_local_experts(w, ids, expert_map)
    assert lid.dtype == torch.int32 and lid.tolist() == [[0, 0], [0, 1]]
    assert lw.tolist() == [[0.5, 0.0], [0.0, 0.125]]
    same_w, same_ids = hook.to_local_experts(w, ids, None)
    assert same_w is w and same_ids is ids


def test_discard_loader_accepts_and_drops_checkpoint_tensors():
    p = torch.nn.Parameter(torch.empty(0), requires_grad=False)
    assert (
        hook.discard_expert_weight(
            param=p,
            loaded_weight=torch.ones(3),
            weight_name="w2",
            shard_id="w2",
            expert_id=5,
            return_success=True,
        )
        is True
    )
    assert p.numel() == 0


def test_ci_vllm_requirements_are_pinned_and_never_name_torch():
    """.ci/run installs this list with --no-deps after torch==2.13.0 (and checks torch
    did not change); a torch-family or unpinned line would let pip move torch."""
    import os
    import re

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, ".ci", "vllm-requirements.txt")) as f:
        lines = [l.split("#")[0].strip() for l in f]
    reqs = [l for l in lines if l]
    assert f"vllm=={hook.VLLM_VERSION}" in reqs
    for line in reqs:
        assert re.fullmatch(r"[A-Za-z0-9_.-]+==[A-Za-z0-9_.+-]+", line), line
        name = line.split("==")[0].lower().replace("_", "-")
        assert name not in {"torch", "torchvision", "torchaudio", "triton", "nvidia-nccl-cu13"}, line
    with open(os.path.join(root, ".ci", "run")) as f:
        run = f.read()
    assert "--no-deps -r .ci/vllm-requirements.txt" in run and "TIERSTORE_TEST_REQUIRE_VLLM=1" in run

"""Tiered mode's hook for upstream vLLM's fused-MoE layer: route its experts through
the pool (exact mode is tierstore/adapters/vllm_config.py + vllm_exact.py).

vLLM is imported here only inside functions: ``import tierstore.adapters.vllm`` works
without vLLM; using a vLLM-backed name without vLLM raises one ConfigError saying what
to install. (vllm_config.py imports vLLM at the top: only register() imports it.)

Target: vLLM ``VLLM_VERSION`` (0.34.0). What we rely on (checked by
tests/adapters/test_adapter_vllm_contract.py; CI installs vLLM, so an upgrade that moves
it fails in CI, not in serving):

* ``FusedMoEMethodBase(moe)`` with ``create_weights(layer, num_experts,
  hidden_size, intermediate_size_per_partition, params_dtype, **extra)``,
  ``get_fused_moe_quant_config(layer)``, ``process_weights_after_loading(layer)``
  and ``apply(layer, x, topk_weights, topk_ids, shared_experts,
  shared_experts_input)`` returning the routed-only [T, H] output;
* ``RoutedExperts`` (``layer_name``, ``local_num_experts``, ``hidden_size``,
  ``params_dtype``, ``moe_config.intermediate_size_per_partition``, ``expert_map``
  global -> local with -1 = not on this rank, ``_replace_quant_method``);
* ``RoutedExperts.load_weights`` calling ``param.weight_loader(param=...,
  loaded_weight=..., weight_name=..., shard_id=..., expert_id=...,
  return_success=True)`` per expert.

Shared experts are run by vLLM's MoE runner (``SharedExpertsOrder.NO_OVERLAP``)
because this method has no modular kernel that could overlap them, so ``apply``
ignores them.

The logic is in :class:`TierstoreMoEMethodLogic` and plain functions that take
any tier with the serving-tier surface (:class:`~tierstore.adapters.vllm_tier.ServingTier`), so it
is tested without vLLM; :func:`method_class` mixes it into vLLM's base class.
"""

from __future__ import annotations

import functools
import importlib
import re
from typing import Any

import torch

from tierstore.errors import ConfigError

VLLM_VERSION = "0.34.0"
_LAYER_NUMBER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


# -- vLLM access ---------------------------------------------------------------
def vllm_available() -> bool:
    try:
        importlib.import_module("vllm")
    except ImportError:
        return False
    return True


def require_vllm(what: str = "this hook"):
    """Import vLLM or raise ConfigError naming the version this hook targets."""
    try:
        return importlib.import_module("vllm")
    except ImportError as exc:
        raise ConfigError(
            f"tierstore.adapters.vllm: {what} needs vLLM, which is not installed "
            f"({exc}); install vllm=={VLLM_VERSION}"
        ) from None


def vllm_names() -> dict[str, Any]:
    require_vllm()
    fm = "vllm.model_executor.layers.fused_moe"
    base = importlib.import_module(f"{fm}.fused_moe_method_base")
    routed = importlib.import_module(f"{fm}.routed_experts")
    return {"FusedMoEMethodBase": base.FusedMoEMethodBase, "RoutedExperts": routed.RoutedExperts}


# -- plain logic (no vLLM needed) ------------------------------------------------
def layer_index_from_name(layer_name: str) -> int:
    """``model.layers.12.mlp.experts`` -> 12, the transformer index. Not a slot-table
    row when the model has dense layers (rows are MoE order); for layer_index_of= of
    packs built per transformer layer."""
    m = _LAYER_NUMBER.search(layer_name)
    if m is None:
        raise ConfigError(
            f"vLLM layer {layer_name!r}: no '.layers.<n>.' in the name, "
            "pass layer_index_of= to map it to a slot-table row"
        )
    return int(m.group(1))


def to_local_experts(
    topk_weights: torch.Tensor, topk_ids: torch.Tensor, expert_map: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Map global expert ids to this rank's ids with vLLM's ``expert_map``.

    Pairs routed to another rank (map entry -1) keep weight 0 and id 0, so the
    shapes stay fixed (capturable) and they add nothing to the output.
    """
    if expert_map is None:
        return topk_weights, topk_ids
    local = expert_map.to(topk_ids.device)[topk_ids.long()]
    here = local >= 0
    return topk_weights * here.to(topk_weights.dtype), torch.where(here, local, 0).to(topk_ids.dtype)


def discard_expert_weight(
    param=None,
    loaded_weight=None,
    weight_name=None,
    shard_id=None,
    expert_id=None,
    return_success: bool = False,
):
    """Weight loader for the placeholder expert parameters: the pack (and its 2-bit
    base) is the source of truth, so checkpoint expert tensors are accepted and
    dropped instead of occupying GPU memory."""
    return True if return_success else None


def is_capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class TierstoreMoEMethodLogic:
    """What a tierstore fused-MoE method does, independent of vLLM's base class.

    ``tier`` has the ServingTier surface (``n_experts``, ``mark_seen``,
    ``ensure_resident``, ``moe_w2_forward``); ``layer_index`` is this layer's row
    in the tier's slot table. Batches of more than ``prefill_tokens`` tokens run
    outside capture are treated as prefill and made resident first (eager,
    scan-resistant); decode batches only mark their experts as seen, in-graph,
    and the runner's ``force_promote`` / ``step_end`` act on those marks.
    """

    def __init__(self, tier, layer_index: int, prefill_tokens: int = 16):
        self.tier = tier
        self.layer_index = int(layer_index)
        self.prefill_tokens = int(prefill_tokens)

    def create_weights(
        self,
        layer,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs,
    ) -> None:
        """Check the layer's geometry against the pack; register empty placeholders
        whose loader drops the checkpoint's expert tensors."""
        check_geometry(self.tier, self.layer_index, num_experts, hidden_size, intermediate_size_per_partition)
        for name in ("w13_weight", "w2_weight"):
            param = torch.nn.Parameter(torch.empty(0, dtype=params_dtype), requires_grad=False)
            param.weight_loader = discard_expert_weight
            layer.register_parameter(name, param)
        layer.tierstore_layer_index = self.layer_index

    def process_weights_after_loading(self, layer) -> None:
        """Nothing to repack: pool rows are already in the kernel's layout."""

    def get_fused_moe_quant_config(self, layer):
        """No vLLM quant config: our kernel dequantises pool / base rows itself."""
        return None

    def apply(
        self,
        layer,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        shared_experts=None,
        shared_experts_input=None,
    ) -> torch.Tensor:
        return routed_forward(
            self.tier,
            self.layer_index,
            x,
            topk_weights,
            topk_ids,
            expert_map=getattr(layer, "expert_map", None),
            prefill_tokens=self.prefill_tokens,
        )


def check_geometry(
    tier, layer_index: int, num_experts: int, hidden_size: int, intermediate_size: int
) -> None:
    """ConfigError naming the layer when vLLM's layer does not match the pack."""
    found = {
        "num_experts": int(num_experts),
        "hidden_size": int(hidden_size),
        "intermediate_size": int(intermediate_size),
    }
    expected = {
        "num_experts": tier.n_experts,
        "hidden_size": getattr(tier, "hidden_size", None),
        "intermediate_size": getattr(tier, "intermediate_size", None),
    }
    bad = [f"{k} {found[k]}, expected {v}" for k, v in expected.items() if v is not None and v != found[k]]
    if not 0 <= layer_index < tier.n_layers:
        bad.append(f"layer index {layer_index}, expected 0..{tier.n_layers - 1}")
    if bad:
        raise ConfigError(
            f"vLLM MoE layer {layer_index} does not match the tierstore pack "
            f"{getattr(tier, 'pack_path', '')}: " + "; ".join(bad)
        )


def routed_forward(
    tier,
    layer_index: int,
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    expert_map: torch.Tensor | None = None,
    prefill_tokens: int = 16,
) -> torch.Tensor:
    """The body of ``apply``: mark seen (in-graph), make prefill experts resident
    (eager only), and run the slot-aware fused MoE. Returns [T, H] in x's dtype."""
    topk_weights, topk_ids = to_local_experts(topk_weights, topk_ids, expert_map)
    tier.mark_seen(layer_index, topk_ids)
    if x.shape[0] > prefill_tokens and not is_capturing():
        tier.ensure_resident(layer_index, topk_ids)
    return tier.moe_w2_forward(x, topk_weights, topk_ids, layer_index)


# -- vLLM-backed names ------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def method_class() -> type:
    """``TierstoreFusedMoEMethod``: our logic on vLLM's ``FusedMoEMethodBase``."""
    base = vllm_names()["FusedMoEMethodBase"]

    class TierstoreFusedMoEMethod(TierstoreMoEMethodLogic, base):
        def __init__(self, moe, tier, layer_index: int, prefill_tokens: int = 16):
            base.__init__(self, moe)
            TierstoreMoEMethodLogic.__init__(self, tier, layer_index, prefill_tokens)

        @property
        def supports_eplb(self) -> bool:
            return False  # EPLB moves Parameters; ours are placeholders

    return TierstoreFusedMoEMethod


def install(
    model: torch.nn.Module, tier, *, layer_index_of=None, drop_weights: bool = True, prefill_tokens: int = 16
) -> int:
    """Swap the quant method of every ``RoutedExperts`` in a loaded vLLM model for
    tierstore's (for tests and custom runners; serving uses ``--quantization
    tierstore``, docs/VLLM.md, which also writes the packs and skips loading experts).

    Rows are MoE-layer order (the n-th RoutedExperts is row n) unless
    ``layer_index_of(layer_name)`` says otherwise. ``drop_weights`` frees the layer's
    own expert tensors (the pack serves them). Call in the worker process, before
    CUDA-graph capture. Returns the number of layers hooked.
    """
    names = vllm_names()
    cls = method_class()
    hooked = 0
    for module in model.modules():
        if not isinstance(module, names["RoutedExperts"]):
            continue
        index = hooked if layer_index_of is None else layer_index_of(module.layer_name)
        # ids reach the kernel mapped to this rank (to_local_experts): the pack is per rank
        check_geometry(
            tier,
            index,
            module.local_num_experts,
            module.hidden_size,
            module.moe_config.intermediate_size_per_partition,
        )
        module._replace_quant_method(cls(module.moe_config, tier, index, prefill_tokens))
        if drop_weights:
            for name in ("w13_weight", "w2_weight"):
                if isinstance(getattr(module, name, None), torch.nn.Parameter):
                    setattr(
                        module,
                        name,
                        torch.nn.Parameter(torch.empty(0, dtype=module.params_dtype), requires_grad=False),
                    )
        hooked += 1
    if hooked == 0:
        raise ConfigError("tierstore.adapters.vllm.install: the model has no RoutedExperts layer")
    return hooked

"""The vLLM classes of ``--quantization tierstore`` (vLLM 0.32 to 0.34): the registered
QuantizationConfig and the exact-mode MoE method. This module imports vLLM at the top:
it is imported only by :func:`tierstore.adapters.vllm_quant.register`, which vLLM's
plugin loader calls in vLLM's own processes.

``TierstoreConfig`` is a module-level class, so vLLM can pickle it into its engine
core and workers (a spawned process gets a fresh :class:`Runtime`: locks, packs and
stores are never pickled).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from vllm.model_executor.layers.fused_moe.fused_moe_method_base import FusedMoEMethodBase
from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization import get_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

from tierstore.adapters import vllm_exact
from tierstore.adapters.vllm_quant import NAME, Runtime, method_class, method_param_names
from tierstore.errors import ConfigError

log = logging.getLogger("vllm.tierstore")
vllm_exact.routed_experts_op()  # registered at import: never created under tracing


def inner_moe_method(inner: QuantizationConfig | None, layer, prefix: str):
    """The MoE method stock vLLM would give this layer."""
    if inner is not None:
        method = inner.get_quant_method(layer, prefix)
        if method is None:
            raise ConfigError(
                f"{prefix}: the checkpoint's quantization {inner.get_name()!r} gives its MoE layer no method"
            )
        return method
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

    return UnquantizedFusedMoEMethod(layer.moe_config)


class TierstoreExactMoEMethod(FusedMoEMethodBase):
    """Stock vLLM's MoE method for the layer (``inner``) over expert bytes served from
    the store (tierstore/adapters/vllm_exact.py says how)."""

    def __init__(self, moe, runtime: Runtime, layer_index: int, inner, prefix: str):
        super().__init__(moe)
        self.runtime, self.layer_index, self.inner, self.prefix = runtime, layer_index, inner, prefix
        self.key = f"{id(runtime):x}:{prefix}"
        self.written = False  # this boot wrote the layer's rows (first boot)
        self.n_created = 0

    # what the runner asks the method, answered as stock's method would
    @property
    def topk_indices_dtype(self):
        return self.inner.topk_indices_dtype

    @property
    def skip_forward_padding(self) -> bool:
        return self.inner.skip_forward_padding

    @property
    def has_unpadded_output(self) -> bool:
        return self.inner.has_unpadded_output

    @property
    def mk_can_overlap_shared_experts(self) -> bool:
        return False  # the runner runs shared experts itself, before the routed ones

    @property
    def is_monolithic(self) -> bool:
        return False

    def uses_weight_scale_2_pattern(self) -> bool:
        return self.inner.uses_weight_scale_2_pattern()

    def maybe_roundup_sizes(self, *args, **kwargs):
        return self.inner.maybe_roundup_sizes(*args, **kwargs)

    def get_fused_moe_quant_config(self, layer):
        return self.inner.get_fused_moe_quant_config(layer)

    def create_weights(
        self,
        layer,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs,
    ) -> None:
        if self.inner.is_monolithic:
            raise ConfigError(
                f"{self.prefix}: vLLM's MoE method {type(self.inner).__name__} "
                "routes inside its kernel (monolithic); exact mode needs the "
                "routed ids: use TIERSTORE_VLLM_MODE=tiered"
            )
        skip = self.runtime.exact_has_layer(self.layer_index, self.inner, params_dtype)
        # loader-skip: a 1-expert placeholder the loader never fills; the kernel is built
        # over it and the parameters are pointed at the shared scratch when serving starts
        self.n_created = 1 if skip else num_experts
        before = {n for n, _ in layer.named_parameters(recurse=False)}
        self.inner.create_weights(
            layer,
            self.n_created,
            hidden_size,
            intermediate_size_per_partition,
            params_dtype,
            **extra_weight_attrs,
        )
        # the method's own parameters; others on the layer (a router's
        # e_score_correction_bias) are not expert weights and load as stock
        self.own = {n for n, _ in layer.named_parameters(recurse=False)} - before
        if skip:
            for name in self.own:
                getattr(layer, name).weight_loader = _drop
        layer.tierstore_layer_index = self.layer_index
        vllm_exact.register_call(self.key, self._call(layer))
        split_at_routed_experts()

    def _call(self, layer):
        def call(x, topk_weights, topk_ids):
            tier = self.runtime.exact_tier()
            return tier.forward(self.layer_index, layer, self.inner, x, topk_weights, topk_ids)

        return call

    def process_weights_after_loading(self, layer) -> None:
        self.inner.process_weights_after_loading(layer)
        where = f"vLLM MoE layer {self.prefix} (tierstore row {self.layer_index})"
        if self.n_created > 1:  # first boot: the processed bytes go to the pack
            planes = vllm_exact.expert_planes(layer, self.n_created, where, self.own)
            self.runtime.exact_write(self.layer_index, planes, where)
            self.written = True
        else:
            planes = [(p.name, getattr(layer, p.name)) for p in self.runtime.exact_layout()]
        for _, param in planes:  # full tensors freed; the scratch is attached at serve
            param.data = param.data[:0]
        self.runtime.exact_layers[self.layer_index] = (layer, where)
        if getattr(layer, "expert_map", None) is not None:  # expert parallelism: this rank's map
            self.runtime.expert_maps[self.layer_index] = layer.expert_map.detach().to("cpu").clone()

    def apply(self, layer, x, topk_weights, topk_ids, shared_experts=None, shared_experts_input=None):
        return torch.ops.tierstore.routed_experts(x, topk_weights, topk_ids, self.key)


SPLIT_OP = "tierstore::routed_experts"


def split_at_routed_experts() -> None:
    """Make the MoE op a graph-splitting op of vLLM's compilation (read when the model is
    compiled, after loading): compiled pieces run around it and, on a GPU, piecewise CUDA
    graphs are captured between MoE calls, which run eagerly (they read routed ids on
    the host). Full-graph decode capture cannot hold it: serve with
    ``--compilation-config '{"cudagraph_mode": "PIECEWISE"}'`` or ``--enforce-eager``."""
    from vllm.config import get_current_vllm_config

    try:
        cc = get_current_vllm_config().compilation_config
    except Exception:  # no current config: a layer built by hand
        return
    if cc.splitting_ops is not None and SPLIT_OP not in cc.splitting_ops:
        cc.splitting_ops.append(SPLIT_OP)


def _drop(
    param=None,
    loaded_weight=None,
    weight_name=None,
    shard_id=None,
    expert_id=None,
    return_success: bool = False,
):
    """Loader-skip: the pack already holds this layer's experts."""
    return True if return_success else None


class TierstoreConfig(QuantizationConfig):
    """Routed experts from tierstore; every other layer through ``inner`` (the
    checkpoint's own config) or, for an unquantized checkpoint, vLLM's unquantized
    methods."""

    def __init__(self, inner: QuantizationConfig | None = None, runtime: Runtime | None = None):
        super().__init__()
        self.inner = inner
        self.runtime = runtime or Runtime()
        if inner is not None:
            self.packed_modules_mapping = inner.packed_modules_mapping

    def __getstate__(self):
        state = self.__dict__.copy()
        state["runtime"] = None  # locks, packs, stores: per process
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.runtime = Runtime()

    def get_name(self):
        return NAME

    def get_supported_act_dtypes(self):
        inner = self.inner.get_supported_act_dtypes() if self.inner else None
        return inner or [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return 0

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []

    @classmethod
    def from_config(cls, config: dict[str, Any]):
        method = config.get("quant_method")
        if not method or method == NAME:
            return cls()
        return cls(get_quantization_config(method).from_config(config))

    @classmethod
    def override_quantization_method(cls, hf_quant_cfg, user_quant, hf_config=None):
        return NAME if user_quant == NAME else None

    def get_quant_method(self, layer, prefix: str):
        if isinstance(layer, RoutedExperts):
            index = self.runtime.moe_index(prefix)
            moe = layer.moe_config
            if self.runtime.mode == "exact":
                inner = inner_moe_method(self.inner, layer, prefix)
                return TierstoreExactMoEMethod(moe, self.runtime, index, inner, prefix)
            create = {
                "num_experts": moe.num_local_experts,
                "hidden_size": moe.hidden_dim,
                "intermediate_size_per_partition": moe.intermediate_size_per_partition,
                "params_dtype": layer.params_dtype,
            }
            names = method_param_names(self.inner, layer, prefix, create)
            return method_class()(moe, self.runtime, index, names)
        if self.inner is not None:
            return self.inner.get_quant_method(layer, prefix)
        if isinstance(layer, LinearBase):
            return UnquantizedLinearMethod()
        return None

    def get_cache_scale_mapper(self):
        return self.inner.get_cache_scale_mapper() if self.inner else super().get_cache_scale_mapper()

    def get_kv_cache_dtype(self, prefix: str):
        return self.inner.get_kv_cache_dtype(prefix) if self.inner else None

    def apply_vllm_mapper(self, hf_to_vllm_mapper):
        if self.inner is not None:
            self.inner.apply_vllm_mapper(hf_to_vllm_mapper)

    def maybe_update_config(self, model_name, hf_config=None, revision=None):
        if self.inner is not None:
            self.inner.maybe_update_config(model_name, hf_config, revision)

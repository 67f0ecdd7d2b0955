"""``--quantization tierstore`` for upstream vLLM (0.32 to 0.34): a registered
QuantizationConfig that serves every routed-expert layer from tierstore and leaves every
other layer to the checkpoint's own quantization method (or vLLM's unquantized ones).

    vllm serve MODEL --quantization tierstore                    # exact mode
    TIERSTORE_VLLM_MODE=tiered vllm serve MODEL --quantization tierstore \\
        --worker-cls tierstore.adapters.vllm_worker.TierstoreWorker

Two modes (TIERSTORE_VLLM_MODE): ``exact`` (default; tierstore/adapters/vllm_exact.py):
the checkpoint's own expert bytes, vLLM's own kernel, the stock model's output; and
``tiered``: the vLLM-Moet recipe, a 2-bit base of every expert plus an FP4 pool.

The entry point ``tierstore = tierstore.adapters.vllm_quant:register`` in the
``vllm.general_plugins`` group runs :func:`register` in every vLLM process before
the model config is checked, so the name is known everywhere. The vLLM classes live in
tierstore/adapters/vllm_config.py (module level, so vLLM can pickle the config).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from typing import Any

import torch

from tierstore import settings
from tierstore.adapters.vllm import TierstoreMoEMethodLogic, require_vllm, vllm_names
from tierstore.adapters.vllm_pack import ExpertCapture, checkpoint_identity, suffix_of
from tierstore.errors import ConfigError

NAME = "tierstore"
log = logging.getLogger("vllm.tierstore")

ENV = settings.EnvSpec(
    "TIERSTORE_VLLM_",
    (
        settings.Var(
            "TIERSTORE_VLLM_DIR",
            "dir",
            settings.optional_path,
            None,
            "directory of the packs written at first boot (default ~/.cache/tierstore/vllm)",
        ),
        settings.Var(
            "TIERSTORE_VLLM_VRAM_GB",
            "vram_gb",
            settings.gib_or_auto,
            None,
            "GiB of the expert pool (auto: free memory after KV minus TIERSTORE_RESERVE_GB)",
        ),
        settings.Var(
            "TIERSTORE_VLLM_RAM_GB", "ram_gb", settings.number(0.0), 0.0, "GiB of the pinned RAM arena"
        ),
        settings.Var(
            "TIERSTORE_VLLM_PREFILL_TOKENS",
            "prefill_tokens",
            settings.integer(1),
            16,
            "tiered mode: eager batches larger than this make their experts resident first",
        ),
        settings.Var(
            "TIERSTORE_VLLM_MODE",
            "mode",
            settings.choice("exact", "tiered", what="mode"),
            "exact",
            "exact: the checkpoint's own experts and vLLM's kernel (stock "
            "output); tiered: 2-bit base + FP4 pool (needs --worker-cls)",
        ),
        settings.Var(
            "TIERSTORE_VLLM_SLOTS",
            "slots",
            lambda v: slots_setting(v),
            "auto",
            "exact mode: pool size in experts: auto, all, floor (one layer's experts), N% of all, or a count",
        ),
    ),
    family="TIERSTORE_VLLM_*",
)


def slots_setting(value) -> str | int:
    """auto | all | floor | N% (0 < N <= 100) | an int >= 1."""
    text = str(value).strip().lower()
    if text in ("auto", "all", "floor"):
        return text
    if text.endswith("%"):
        pct = settings.number(0.0, 100.0, lo_open=True)(text[:-1])
        return f"{pct}%"
    try:
        return settings.integer(1)(text)
    except ValueError:
        raise ValueError("expected auto, all, floor, N% (0 < N <= 100) or an integer >= 1") from None


# parameter names a checkpoint's method gives its experts; the placeholders for each
# method are found by running it on a meta device (method_param_names); this is the
# fallback when that fails.
KNOWN_PARAMS = (
    "w13_weight",
    "w2_weight",
    "w13_weight_scale",
    "w2_weight_scale",
    "w13_weight_scale_inv",
    "w2_weight_scale_inv",
    "w13_weight_scale_2",
    "w2_weight_scale_2",
    "w13_input_scale",
    "w2_input_scale",
)


def default_pack_dir() -> str:
    return os.path.join(os.path.expanduser("~"), ".cache", "tierstore", "vllm")


class Runtime:
    """What one model load shares across its MoE layers (not an nn.Module: layers and
    methods may point at it without creating a module cycle).

    ``moe_index(prefix)`` numbers RoutedExperts layers in construction order, the
    order of the pack's rows: a model whose first layers are dense still starts at 0."""

    def __init__(
        self,
        *,
        pack_dir: str | None = None,
        ckpt_id: str | None = None,
        n_layers: int | None = None,
        device=None,
        env: dict | None = None,
    ):
        self.env = ENV.parse() if env is None else env
        self.pack_dir = pack_dir or self.env["dir"] or default_pack_dir()
        self.ckpt_id, self.n_layers, self.device = ckpt_id, n_layers, device
        self.indices: dict[str, int] = {}
        self.capture: ExpertCapture | None = None
        self.tier = None
        self.loaded: set[int] = set()  # MoE layers whose experts the pack already holds
        self.mode = self.env.get("mode", "exact")
        self.exact_packs = None  # exact mode: vllm_exact.ExactPacks
        self.exact = None  # exact mode: vllm_exact.ExactTier, at first forward
        self.exact_layers: dict[int, tuple] = {}
        self.expert_maps: dict = {}  # exact mode under EP: MoE layer -> global->local map
        self._lock = threading.Lock()

    def moe_index(self, prefix: str) -> int:
        with self._lock:
            return self.indices.setdefault(prefix, len(self.indices))

    def _context(self) -> None:
        """Fill checkpoint id, layer bound and device from vLLM's current config."""
        if self.ckpt_id and self.n_layers and self.device is not None:
            return
        from vllm.config import get_current_vllm_config

        cfg = get_current_vllm_config()
        mc = cfg.model_config
        if not self.ckpt_id:
            self.ckpt_id = checkpoint_identity(mc.model, mc.revision) if mc else "unknown"
        if not self.n_layers:
            self.n_layers = int(mc.hf_text_config.num_hidden_layers) if mc else 0
        if self.device is None:
            self.device = cfg.device_config.device or "cpu"

    # -- exact mode (tierstore/adapters/vllm_exact.py) ----------------------------------
    def _packs(self):
        from tierstore.adapters.vllm_exact import ExactPacks

        self._context()
        with self._lock:
            if self.exact_packs is None:
                self.exact_packs = ExactPacks(self.pack_dir, ckpt_id=self.ckpt_id, n_layers=self.n_layers)
            return self.exact_packs

    def exact_has_layer(self, layer: int, inner, dtype) -> bool:
        return self._packs().has_layer(layer, inner, dtype)

    def exact_write(self, layer: int, planes, where: str) -> None:
        self._packs().write(layer, planes, where)

    def exact_layout(self):
        return self._packs().layout

    def exact_tier(self):
        """The model's ExactTier, opened at the first forward (after every layer was
        loaded and written): pool sized, every layer's planes on the shared scratch."""
        if self.exact is not None:
            return self.exact
        from tierstore.adapters.vllm_exact import ExactTier, pool_slots

        packs = self._packs()
        with self._lock:
            if self.exact is None:
                n_moe = len(self.indices)
                path = packs.finish(n_moe)
                from tierstore.format.pack import Pack

                probe = Pack.open(path)
                E, slot_bytes = int(probe.n_experts), int(probe.slot_bytes)
                probe.close()
                slots = pool_slots(
                    self.env["slots"],
                    n_moe_layers=n_moe,
                    n_experts=E,
                    slot_bytes=slot_bytes,
                    device=self.device,
                )
                tier = ExactTier(path, slots=slots, device=self.device, ram_gb=self.env["ram_gb"])
                for index, (layer, where) in self.exact_layers.items():
                    tier.adopt(layer, where, self.expert_maps.get(index))
                how = (
                    f"first boot wrote {len(packs.wrote)} MoE layers"
                    if packs.wrote
                    else "loader-skip: every MoE layer from the pack"
                )
                log.info(
                    "tierstore exact: %s; pack %s; pool %d of %d experts (%d B each) on %s",
                    how,
                    path,
                    slots,
                    n_moe * E,
                    slot_bytes,
                    self.device,
                )
                self.exact = tier
            return self.exact

    def capture_for(self, layer, num_experts: int, H: int, I: int) -> ExpertCapture:
        self._context()
        with self._lock:
            if self.capture is None:
                self.capture = ExpertCapture(
                    self.pack_dir,
                    ckpt_id=self.ckpt_id,
                    n_layers=self.n_layers,
                    n_experts=num_experts,
                    H=H,
                    I=I,
                )
            cap = self.capture
        if (cap.E, cap.H, cap.I) != (num_experts, H, I):
            raise ConfigError(
                f"vLLM MoE layer {layer}: E={num_experts}, H={H}, I={I} differs "
                f"from the first MoE layer's E={cap.E}, H={cap.H}, I={cap.I}"
            )
        if not 0 <= layer < cap.n_layers:
            raise ConfigError(
                f"vLLM MoE layer {layer}: more MoE layers than the model's {cap.n_layers} transformer layers"
            )
        return cap

    def finish_load(self):
        """After vLLM loaded every weight: all started layers complete, packs closed,
        the serving tier opened. Idempotent; returns the tier."""
        from tierstore.adapters.vllm_tier import ServingTier

        with self._lock:
            if self.tier is not None:
                return self.tier
            cap = self.capture
            if cap is None:
                raise ConfigError("--quantization tierstore: the model has no RoutedExperts layer")
            missing = {l: n for l, n in cap.pending().items()}
            unwritten = [l for l in range(len(self.indices)) if not cap.is_written(l)]
            if missing or unwritten:
                raise ConfigError(
                    f"tierstore first boot incomplete: MoE layers {unwritten[:8]} "
                    f"have no pack rows (experts missing per layer: {missing}); "
                    f"the checkpoint did not deliver every routed expert"
                )
            packs = cap.paths()
            cap.close()
            self._check_worker()
            self.tier = ServingTier(packs, device=self.device, **self.store_options())
            log.info(
                "tierstore tiered: packs %s; %d MoE layers; 2-bit base on %s; FP4 pool "
                "sized after the KV cache (%s)",
                packs,
                len(self.indices),
                self.device,
                f"TIERSTORE_VLLM_VRAM_GB={self.env['vram_gb']}"
                if self.env["vram_gb"] is not None
                else "auto",
            )
            return self.tier

    def _check_worker(self) -> None:
        """Tiered mode lives on per-step hooks only the worker class gives; inside an
        engine without it the pool would never fill (a silent 2-bit model): refused."""
        from vllm.config import get_current_vllm_config

        try:
            cfg = get_current_vllm_config()
            in_engine = cfg.model_config is not None
            worker = str(getattr(cfg.parallel_config, "worker_cls", ""))
        except Exception:  # no current config (vLLM 0.34 asserts): a hand-built layer
            in_engine, worker = False, ""
        if in_engine and "TierstoreWorker" not in worker:
            raise ConfigError(
                "TIERSTORE_VLLM_MODE=tiered needs the per-step hooks of "
                "--worker-cls tierstore.adapters.vllm_worker.TierstoreWorker "
                "(or use the default exact mode, which needs none)"
            )

    def store_options(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ram_gb": self.env["ram_gb"]}
        if self.env["vram_gb"] is not None:
            out["vram_gb"] = self.env["vram_gb"]
        return out


def method_param_names(inner_config, layer, prefix: str, create_args: dict) -> list[str]:
    """The expert parameters the checkpoint's own method would register, found by
    running its create_weights on a scratch module on the meta device."""
    if inner_config is None:
        return ["w13_weight", "w2_weight"]
    try:
        inner = inner_config.get_quant_method(layer, prefix)
        scratch = torch.nn.Module()
        with torch.device("meta"):
            inner.create_weights(scratch, **create_args)
        names = [n for n, _ in scratch.named_parameters(recurse=False)]
        return [n for n in names if n.startswith(("w13_", "w2_"))] or list(KNOWN_PARAMS)
    except Exception:  # a method that cannot build on meta: register every known name
        return list(KNOWN_PARAMS)


class TierstoreMethodMixin(TierstoreMoEMethodLogic):
    """create_weights: placeholders for every expert parameter of the checkpoint's
    method. Their loader writes the pack at first boot and drops the tensor once the
    pack holds the layer (loader-skip). ``requires_device_loading = False``: vLLM never
    moves these placeholders to the GPU for process_weights_after_loading."""

    requires_device_loading = False

    def __init__(self, runtime: Runtime, layer_index: int, param_names: list[str]):
        TierstoreMoEMethodLogic.__init__(self, None, layer_index, runtime.env["prefill_tokens"])
        self.runtime, self.param_names = runtime, list(param_names)

    def create_weights(
        self,
        layer,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs,
    ) -> None:
        cap = self.runtime.capture_for(
            self.layer_index, num_experts, hidden_size, intermediate_size_per_partition
        )
        skip = cap.is_written(self.layer_index)
        for name in self.param_names:
            suffix_of(name)
            param = torch.nn.Parameter(torch.empty(0, dtype=params_dtype, device="cpu"), requires_grad=False)
            param.weight_loader = _drop if skip else cap.loader(self.layer_index, name)
            layer.register_parameter(name, param)
        # a plain int attribute, never a module reference: no cycle in named_modules
        layer.tierstore_layer_index = self.layer_index
        from tierstore.adapters import vllm_exact

        vllm_exact.routed_experts_op()
        self.call_key = f"{id(self.runtime):x}:tiered:{self.layer_index}"
        vllm_exact.register_call(self.call_key, lambda x, w, i: self._forward(layer, x, w, i))

    def process_weights_after_loading(self, layer) -> None:
        self.tier = self.runtime.finish_load()

    def apply(self, layer, x, topk_weights, topk_ids, shared_experts=None, shared_experts_input=None):
        # through the opaque custom op (registered in create_weights): torch.compile,
        # vLLM-CPU's default, must not trace the tier's host-side work
        return torch.ops.tierstore.routed_experts(x, topk_weights, topk_ids, self.call_key)

    def _forward(self, layer, x, topk_weights, topk_ids):
        if self.tier is None:
            self.tier = self.runtime.finish_load()
        return TierstoreMoEMethodLogic.apply(self, layer, x, topk_weights, topk_ids)


def _drop(
    param=None,
    loaded_weight=None,
    weight_name=None,
    shard_id=None,
    expert_id=None,
    return_success: bool = False,
):
    """Loader-skip: the pack already holds this layer."""
    return True if return_success else None


@functools.lru_cache(maxsize=1)
def method_class() -> type:
    base = vllm_names()["FusedMoEMethodBase"]

    class TierstoreVllmMoEMethod(TierstoreMethodMixin, base):
        def __init__(self, moe, runtime: Runtime, layer_index: int, param_names: list[str]):
            base.__init__(self, moe)
            TierstoreMethodMixin.__init__(self, runtime, layer_index, param_names)

        @property
        def supports_eplb(self) -> bool:
            return False

    return TierstoreVllmMoEMethod


def config_class() -> type:
    """``TierstoreConfig`` (tierstore/adapters/vllm_config.py, imported here: vLLM needed)."""
    require_vllm("--quantization tierstore")
    from tierstore.adapters.vllm_config import TierstoreConfig

    return TierstoreConfig


def check_settings(environ=None) -> None:
    """Refuse bad TIERSTORE_VLLM_* settings before vLLM boots anything: one line on
    stderr and a non-zero exit (SystemExit), never a traceback from inside an engine.
    Checked only when one is set (whoever sets none is not asking for tierstore here):
    every value, and a pack directory that is read-only and holds no pack to serve."""
    environ = os.environ if environ is None else environ
    if not any(k.startswith("TIERSTORE_VLLM_") for k in environ):
        return
    try:
        env = ENV.parse(environ)
    except ConfigError as exc:
        raise SystemExit(f"tierstore: {exc}") from None
    d = env["dir"] or default_pack_dir()
    probe = d
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    if not os.access(probe, os.W_OK):
        has_pack = os.path.isdir(d) and any(n.endswith(".pack") for n in os.listdir(d))
        if not has_pack:
            raise SystemExit(
                f"tierstore: TIERSTORE_VLLM_DIR={d}: not writable and holds no "
                "pack; the first boot writes the packs there: give a writable "
                "directory (later boots may then use it read-only)"
            )


def register() -> type:
    """Register ``tierstore`` with vLLM's quantization registry (idempotent)."""
    from vllm.model_executor.layers.quantization import register_quantization_config

    check_settings()
    # workers' store metrics reach this process's /metrics (the API server's, the first
    # process to call this); idempotent, and off with TIERSTORE_METRICS=0
    if settings.get("metrics"):
        from tierstore import metrics

        metrics.setup_scrape_process()
    cls = config_class()
    register_quantization_config(NAME)(cls)
    return cls

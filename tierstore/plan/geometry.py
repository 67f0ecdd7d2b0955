"""Model geometry for the planner: from a Hugging Face ``config.json``, a pack, or flags.

``Geometry`` holds what the memory model needs: the MoE stack (layers, experts, top-k,
hidden, moe_intermediate, dense layers, shared experts), attention (GQA, MLA, or
DeepSeek-V4's compressed attention with its per-layer compress ratios and sliding
window), vocabulary and MTP layers. ``from_hf_config`` reads the families that ship
their MoE geometry under these keys:

* deepseek_v2 / v3 / v4: ``n_routed_experts``, ``num_experts_per_tok``,
  ``moe_intermediate_size``, ``first_k_dense_replace`` dense layers, ``n_shared_experts``
  x ``moe_intermediate_size`` shared; MLA (``kv_lora_rank``) or V4's ``compress_ratios``;
* mixtral: ``num_local_experts``, ``num_experts_per_tok``, ``intermediate_size`` per
  expert, no dense layer, no shared expert;
* qwen2_moe / qwen3_moe: ``num_experts``, ``num_experts_per_tok``,
  ``moe_intermediate_size``; dense layers from ``mlp_only_layers`` and
  ``decoder_sparse_step``; ``shared_expert_intermediate_size`` (Qwen2).

A ``text_config`` inside the file (multimodal wrappers) is read instead of the top level.
The file is untrusted: read through ``files.untrusted.read_json`` (size cap, strict
JSON), every number checked (an integer in range; NaN or a string is an error naming the
key). A config without routed experts is refused: the planner sizes expert caches.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from tierstore.errors import ConfigError, FormatError

MAX_CONFIG_BYTES = 4 << 20
_LIMIT = 1 << 24  # no dimension of a real model comes near it; a hostile value is refused


@dataclass(frozen=True)
class Geometry:
    moe_layers: int  # layers with routed experts (MTP layers not counted)
    n_experts: int  # routed experts per MoE layer
    top_k: int
    hidden: int = 0
    moe_intermediate: int = 0  # one routed expert's intermediate width
    dense_layers: int = 0  # layers with a dense MLP instead of experts
    dense_intermediate: int = 0
    shared_intermediate: int = 0  # all shared experts of one MoE layer together
    vocab: int = 0
    tie_embeddings: bool = False
    mtp_layers: int = 0  # next-token-prediction layers (used with MTP speculation)
    attention: str = "gqa"  # gqa | mla | dsv4
    n_heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_dim: int = 0
    qk_nope_dim: int = 0
    v_head_dim: int = 0
    o_lora_rank: int = 0
    o_groups: int = 0
    sliding_window: int = 0
    index_head_dim: int = 0
    compress_ratios: tuple = field(default_factory=tuple)  # dsv4: per main layer
    dense_quant: str = ""  # the checkpoint's quant_method, if any ("fp8", ...)
    name: str = ""

    @property
    def n_layers(self) -> int:
        return self.moe_layers + self.dense_layers

    @property
    def n_keys(self) -> int:
        return self.moe_layers * self.n_experts

    def as_dict(self) -> dict:
        d = asdict(self)
        d["compress_ratios"] = list(self.compress_ratios)
        d["n_layers"], d["n_keys"] = self.n_layers, self.n_keys
        return d

    def with_overrides(self, **values) -> Geometry:
        given = {k: v for k, v in values.items() if v is not None}
        return replace(self, **given) if given else self

    def check(self, what: str = "geometry") -> Geometry:
        """ConfigError naming every missing or impossible field, all at once."""
        problems = []
        for name in ("moe_layers", "n_experts", "top_k", "hidden"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1 (found {getattr(self, name)})")
        if self.top_k > self.n_experts >= 1:
            problems.append(f"top_k {self.top_k} > n_experts {self.n_experts}")
        if self.compress_ratios and len(self.compress_ratios) < self.n_layers:
            problems.append(
                f"compress_ratios lists {len(self.compress_ratios)} layers, the model has {self.n_layers}"
            )
        if problems:
            raise ConfigError(f"{what}: " + "; ".join(problems))
        return self


def _int(cfg: dict, key: str, path, default=None, lo: int = 0) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise FormatError(f"{path}: missing {key!r}, expected an integer")
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (isinstance(value, float) and (not math.isfinite(value) or not value.is_integer()))
    ):
        raise FormatError(f"{path}: {key} = {value!r}, expected an integer")
    if not lo <= int(value) <= _LIMIT:
        raise FormatError(f"{path}: {key} = {value}, expected an integer in [{lo}, {_LIMIT}]")
    return int(value)


def _first(cfg: dict, keys: tuple[str, ...]) -> str | None:
    return next((k for k in keys if cfg.get(k) is not None), None)


def from_hf_config(path) -> Geometry:
    """Geometry of the Hugging Face ``config.json`` at ``path`` (module doc).
    FormatError naming the file and key; FileNotFoundError when missing."""
    from tierstore.files.untrusted import read_json

    cfg = read_json(path, MAX_CONFIG_BYTES, "model config.json")
    if not isinstance(cfg, dict):
        raise FormatError(f"{path}: expected a JSON object (a Hugging Face config.json)")
    if isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg["text_config"], "quantization_config": cfg.get("quantization_config")}
    kind = str(cfg.get("model_type") or "")
    expert_key = _first(cfg, ("n_routed_experts", "num_local_experts", "num_experts"))
    if expert_key is None:
        raise ConfigError(
            f"{path}: not a mixture-of-experts config (model_type {kind!r} has "
            f"no n_routed_experts, num_local_experts or num_experts); "
            f"tierstore plan sizes routed-expert caches"
        )
    n_experts = _int(cfg, expert_key, path, lo=1)
    top_k = _int(cfg, "num_experts_per_tok", path, lo=1)
    n_layers = _int(cfg, "num_hidden_layers", path, lo=1)
    hidden = _int(cfg, "hidden_size", path, lo=1)
    dense_i = _int(cfg, "intermediate_size", path, default=0)
    if kind == "mixtral" or expert_key == "num_local_experts":
        moe_i, dense_layers, shared = dense_i, 0, 0
    else:
        moe_i = _int(cfg, "moe_intermediate_size", path, lo=1)
        dense_layers = _int(cfg, "first_k_dense_replace", path, default=0)
        if "mlp_only_layers" in cfg or "decoder_sparse_step" in cfg:  # Qwen2/3-MoE
            only = cfg.get("mlp_only_layers") or []
            step = _int(cfg, "decoder_sparse_step", path, default=1, lo=1)
            if not isinstance(only, list) or not all(isinstance(x, int) for x in only):
                raise FormatError(f"{path}: mlp_only_layers = {only!r}, expected a list of ints")
            dense_layers = sum(1 for i in range(n_layers) if i in only or (i + 1) % step != 0)
        shared = _int(cfg, "shared_expert_intermediate_size", path, default=0)
        if not shared:
            shared = _int(cfg, "n_shared_experts", path, default=0) * moe_i
    if dense_layers >= n_layers:
        raise ConfigError(f"{path}: {dense_layers} dense layers of {n_layers}: no MoE layer")
    heads = _int(cfg, "num_attention_heads", path, default=0)
    geo = dict(
        moe_layers=n_layers - dense_layers,
        n_experts=n_experts,
        top_k=top_k,
        hidden=hidden,
        moe_intermediate=moe_i,
        dense_layers=dense_layers,
        dense_intermediate=dense_i,
        shared_intermediate=shared,
        vocab=_int(cfg, "vocab_size", path, default=0),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        mtp_layers=_int(cfg, "num_nextn_predict_layers", path, default=0),
        n_heads=heads,
        kv_heads=_int(cfg, "num_key_value_heads", path, default=heads),
        q_lora_rank=_int(cfg, "q_lora_rank", path, default=0),
        kv_lora_rank=_int(cfg, "kv_lora_rank", path, default=0),
        qk_rope_dim=_int(cfg, "qk_rope_head_dim", path, default=0),
        qk_nope_dim=_int(cfg, "qk_nope_head_dim", path, default=0),
        v_head_dim=_int(cfg, "v_head_dim", path, default=0),
        o_lora_rank=_int(cfg, "o_lora_rank", path, default=0),
        o_groups=_int(cfg, "o_groups", path, default=0),
        sliding_window=_int(cfg, "sliding_window", path, default=0)
        if cfg.get("sliding_window") is not None
        else 0,
        index_head_dim=_int(cfg, "index_head_dim", path, default=0),
        name=str(cfg.get("_name_or_path") or kind or "model"),
    )
    head_dim = cfg.get("head_dim")
    geo["head_dim"] = (
        _int(cfg, "head_dim", path, lo=1) if head_dim is not None else (hidden // heads if heads else 0)
    )
    ratios = cfg.get("compress_ratios")
    if ratios is not None:
        if not isinstance(ratios, list) or not all(
            isinstance(r, int) and not isinstance(r, bool) and 0 <= r <= _LIMIT for r in ratios
        ):
            raise FormatError(f"{path}: compress_ratios must be a list of integers >= 0")
        geo["attention"], geo["compress_ratios"] = "dsv4", tuple(ratios[:n_layers])
    elif geo["kv_lora_rank"]:
        geo["attention"] = "mla"
    quant = cfg.get("quantization_config")
    if isinstance(quant, dict) and isinstance(quant.get("quant_method"), str):
        geo["dense_quant"] = quant["quant_method"].lower()
    return Geometry(**geo).check(str(path))


def from_pack(path) -> dict:
    """What a pack tells the planner: layers, experts and the row size (slot_bytes,
    stride). Opening validates it (FormatError naming the file)."""
    from tierstore.format.pack import Pack

    pack = Pack.open(path)
    try:
        return {
            "moe_layers": int(pack.n_layers),
            "n_experts": int(pack.n_experts),
            "slot_bytes": int(pack.slot_bytes),
            "stride": int(pack.stride),
            "tag": str(pack.tag),
            "pack": pack,
        }
    except Exception:
        pack.close()
        raise

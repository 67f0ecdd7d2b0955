"""The planner's memory model: what one card holds when it serves a MoE model from a
resident base plus a pool of expert rows, and whether the pool clears the fire floor.

    card = non-expert weights + resident base + KV cache + activations + reserve + pool

* **non-expert weights**: embeddings and lm_head (bf16), attention, routers, shared
  experts, dense MLP layers (at ``dense_dtype``: the checkpoint's fp8 when its config
  says so, else bf16); MTP layers when speculation uses them. DeepSeek-V4's compressor
  and indexer weights are not counted (small); ``dense_gb`` replaces the estimate with
  a measured figure.
* **resident base**: every routed expert at ``base_dtype`` (vLLM-Moet's 2-bit ``base``
  rows by default; ``none`` for an exact-mode pool, where the pool is the only copy).
* **KV cache**: ``max_seqs`` sequences at ``context`` tokens: GQA 2 x kv_heads x head_dim
  per token and layer; MLA kv_lora_rank + rope dims; DeepSeek-V4 a sliding window of
  head_dim entries on every layer plus context / ratio compressed entries on its
  compressed layers (and the indexer's keys on ratio-4 layers).
* **activations**: an estimate of the profile forward's peak: ``batched_tokens x (8 H +
  3 top_k I) x 2`` bytes plus fp32 logits and probabilities of every sampled row.
* **reserve**: what vLLM leaves unused, ``(1 - gpu_util) x card`` (its
  ``--gpu-memory-utilization``, 0.9 by default: CUDA context, graphs, fragmentation live
  there), plus ``reserve_gb`` more. vLLM sizes its KV cache from ``gpu_util x card`` minus
  the model (an explicit pool, allocated at load, counts as model), so a pool past this
  budget leaves no room for KV blocks: the boot fails (vLLM-Moet's "7 GiB OOMs at load").
* **pool**: the rest, in slots: ``tierstore.store.sizing.auto_slots`` (the store's own
  auto sizing), or the slots of a given ``pool_gb``; checked against
  ``sizing.fire_floor`` (the store's floor). GiB here are 2^30 bytes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from tierstore.errors import ConfigError
from tierstore.plan.geometry import Geometry
from tierstore.store import sizing

GIB = sizing.GIB
# Bytes per parameter of one routed expert (three H x I matrices: w1 and w3 as w13, w2),
# scales included. At DS4 (H 4096, I 2048): fp4 12 MiB (vLLM-Moet's "delta" rows, scales
# elsewhere), mxfp4 12.75 MiB ("fp4" rows with e8m0 scales), fp4q 7.5 MiB, base2 6.75 MiB.
EXPERT_DTYPES = {
    "fp4": 0.5,
    "mxfp4": 0.5 + 1 / 32,
    "nvfp4": 0.5 + 1 / 16,
    "fp4q": 5 / 16,
    "base2": 0.25 + 1 / 32,
    "fp8": 1.0 + 4 / (128 * 128),
    "bf16": 2.0,
    "fp16": 2.0,
}
BASE_DTYPES = ("none",) + tuple(EXPERT_DTYPES)
DENSE_DTYPES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0 + 4 / (128 * 128), "fp32": 4.0}
KV_DTYPES = {"auto": 2, "bf16": 2, "fp16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


@dataclass(frozen=True)
class Inputs:
    card_gb: float
    context: int = 8192
    max_seqs: int = 1
    spec_tokens: int = 0
    kv_dtype: str = "auto"
    expert_dtype: str = "fp4"
    base_dtype: str = "base2"
    dense_dtype: str | None = None  # None: fp8 when the checkpoint is fp8, else bf16
    reserve_gb: float = 0.0  # beyond (1 - gpu_util) x card
    gpu_util: float = 0.9  # vLLM's --gpu-memory-utilization
    batched_tokens: int = 2048
    gate_fp_max: int = 3
    pool_gb: float | None = None  # None: the largest pool that fits
    max_gb: float = 0.0  # cap on that pool (0: none)
    dense_gb: float | None = None  # measured non-expert weights (replaces the estimate)
    kv_gb: float | None = None  # measured KV cache (replaces the model)
    activation_gb: float | None = None
    slot_bytes: int | None = None  # a pack's row size (replaces expert_dtype)


def expert_row_bytes(geo: Geometry, dtype: str) -> int:
    if dtype not in EXPERT_DTYPES:
        raise ConfigError(f"expert dtype {dtype!r}: expected one of {', '.join(EXPERT_DTYPES)}")
    return int(math.ceil(3 * geo.hidden * geo.moe_intermediate * EXPERT_DTYPES[dtype]))


def mtp_used(geo: Geometry, inp: Inputs) -> int:
    """MTP layers loaded: the checkpoint's, when speculation is on."""
    return geo.mtp_layers if inp.spec_tokens > 0 else 0


def attention_params(geo: Geometry) -> int:
    H, heads = geo.hidden, geo.n_heads
    if geo.attention == "mla":
        qk = geo.qk_nope_dim + geo.qk_rope_dim
        q = (H * geo.q_lora_rank + geo.q_lora_rank * heads * qk) if geo.q_lora_rank else H * heads * qk
        kv = H * (geo.kv_lora_rank + geo.qk_rope_dim) + geo.kv_lora_rank * heads * (
            geo.qk_nope_dim + geo.v_head_dim
        )
        return q + kv + heads * geo.v_head_dim * H
    hd = geo.head_dim
    q = (H * geo.q_lora_rank + geo.q_lora_rank * heads * hd) if geo.q_lora_rank else H * heads * hd
    kv_mats = 1 if geo.attention == "dsv4" else 2  # V4: one shared K=V head
    kv = kv_mats * H * geo.kv_heads * hd
    if geo.o_lora_rank:
        o = heads * hd * geo.o_lora_rank + max(geo.o_groups, 1) * geo.o_lora_rank * H
    else:
        o = heads * hd * H
    return q + kv + o


def non_expert_bytes(geo: Geometry, inp: Inputs) -> int:
    """Embeddings + lm_head (bf16) and every layer's non-routed weights (module doc)."""
    dense = DENSE_DTYPES[dense_dtype_of(geo, inp)]
    H = geo.hidden
    embed = geo.vocab * H * (1 if geo.tie_embeddings else 2) * 2
    attn = attention_params(geo)
    moe_layer = attn + geo.n_experts * H + 3 * H * geo.shared_intermediate
    dense_layer = attn + 3 * H * geo.dense_intermediate
    mtp = mtp_used(geo, inp) * (moe_layer + 2 * H * H)
    params = geo.moe_layers * moe_layer + geo.dense_layers * dense_layer + mtp
    return int(embed + params * dense)


def dense_dtype_of(geo: Geometry, inp: Inputs) -> str:
    if inp.dense_dtype:
        return inp.dense_dtype
    return "fp8" if geo.dense_quant == "fp8" else "bf16"


def kv_bytes_per_seq(geo: Geometry, inp: Inputs, context: int) -> int:
    """KV cache of one sequence at ``context`` tokens (module doc)."""
    width = KV_DTYPES[inp.kv_dtype]
    layers = geo.n_layers + mtp_used(geo, inp)
    if geo.attention == "mla":
        return int(layers * context * (geo.kv_lora_rank + geo.qk_rope_dim) * width)
    if geo.attention != "dsv4":
        return int(layers * context * 2 * geo.kv_heads * geo.head_dim * width)
    window = min(context, geo.sliding_window) if geo.sliding_window else context
    ratios = list(geo.compress_ratios[: geo.n_layers]) + [0] * mtp_used(geo, inp)
    elems = 0
    for r in ratios:
        elems += window * geo.head_dim
        if r > 0:
            elems += (context // r) * geo.head_dim
            if r == 4 and geo.index_head_dim:
                elems += (context // r) * geo.index_head_dim
    return int(elems * width)


def activation_bytes(geo: Geometry, inp: Inputs) -> int:
    rows = inp.max_seqs * (1 + inp.spec_tokens)
    tokens = max(inp.batched_tokens, rows)
    per_token = 8 * geo.hidden + 3 * geo.top_k * geo.moe_intermediate
    return int(tokens * per_token * 2 + rows * geo.vocab * 4 * 2)


@dataclass
class Budget:
    card: int
    items: list = field(default_factory=list)  # [name, bytes, note]
    slot_bytes: int = 0
    n_keys: int = 0
    pool_slots: int = 0
    pool_bytes: int = 0
    left_over: int = 0  # bytes of the card no item takes (0 when the pool is auto)
    deficit: int = 0  # bytes past the card (0 when everything fits)
    floor: int = 0
    floor_holds: bool = False
    short_slots: int = 0
    max_context_for_floor: int = 0
    max_seqs_for_floor: int = 0
    does_not_fit: list = field(default_factory=list)
    floor_what: str = ""

    def item(self, name: str) -> int:
        return next(b for n, b, _ in self.items if n == name)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["items"] = [{"name": n, "bytes": b, "gib": b / GIB, "note": note} for n, b, note in self.items]
        return d


def _fixed(geo: Geometry, inp: Inputs, context: int, max_seqs: int) -> list:
    """The items that come before the pool: [name, bytes, note]."""
    base_rows = (geo.moe_layers + mtp_used(geo, inp)) * geo.n_experts
    base = 0 if inp.base_dtype == "none" else base_rows * expert_row_bytes(geo, inp.base_dtype)
    dense = int(inp.dense_gb * GIB) if inp.dense_gb is not None else non_expert_bytes(geo, inp)
    kv = int(inp.kv_gb * GIB) if inp.kv_gb is not None else max_seqs * kv_bytes_per_seq(geo, inp, context)
    act = int(inp.activation_gb * GIB) if inp.activation_gb is not None else activation_bytes(geo, inp)
    return [
        [
            "non-expert weights",
            dense,
            "given"
            if inp.dense_gb is not None
            else f"estimate, {dense_dtype_of(geo, inp)} (+ bf16 embeddings)",
        ],
        [
            "resident base",
            base,
            f"{base_rows} experts x {inp.base_dtype}" if base else "none (the pool is the only copy)",
        ],
        [
            "KV cache",
            kv,
            "given"
            if inp.kv_gb is not None
            else f"{max_seqs} seq x {context} tokens, {inp.kv_dtype}, {geo.attention}",
        ],
        [
            "activations",
            act,
            "given"
            if inp.activation_gb is not None
            else f"estimate, {max(inp.batched_tokens, max_seqs * (1 + inp.spec_tokens))} tokens",
        ],
        [
            "reserve",
            reserve_bytes(inp),
            f"(1 - gpu_util {inp.gpu_util:g}) x card"
            + (f" + {inp.reserve_gb:g} GiB" if inp.reserve_gb else ""),
        ],
    ]


def reserve_bytes(inp: Inputs) -> int:
    return int((1.0 - inp.gpu_util) * inp.card_gb * GIB + inp.reserve_gb * GIB)


def _pool_slots(geo: Geometry, inp: Inputs, items: list, card: int, slot_bytes: int, n_keys: int) -> int:
    before = sum(b for n, b, _ in items if n != "reserve")
    if inp.pool_gb is not None:
        return min(sizing.slots_for_gib(inp.pool_gb, slot_bytes), n_keys)
    return sizing.auto_slots(
        slot_bytes=slot_bytes,
        n_keys=n_keys,
        available=card - before,
        reserve_gb=reserve_bytes(inp) / GIB,
        max_gb=inp.max_gb,
    )


def plan_memory(geo: Geometry, inp: Inputs) -> Budget:
    """The budget of ``geo`` served with ``inp`` on one card (module doc)."""
    geo.check()
    card = int(inp.card_gb * GIB)
    slot_bytes = inp.slot_bytes or expert_row_bytes(geo, inp.expert_dtype)
    n_keys = (geo.moe_layers + mtp_used(geo, inp)) * geo.n_experts
    items = _fixed(geo, inp, inp.context, inp.max_seqs)
    slots = _pool_slots(geo, inp, items, card, slot_bytes, n_keys)
    b = Budget(
        card=card,
        items=items,
        slot_bytes=slot_bytes,
        n_keys=n_keys,
        pool_slots=slots,
        pool_bytes=slots * slot_bytes,
    )
    b.items.append(["pool", b.pool_bytes, f"{slots} slots x {slot_bytes / 2**20:.2f} MiB"])
    used = sum(x for _, x, _ in b.items)
    b.deficit, b.left_over = max(used - card, 0), max(card - used, 0)
    b.floor = sizing.fire_floor(geo.moe_layers, geo.top_k, inp.spec_tokens, inp.max_seqs, inp.gate_fp_max)
    b.floor_what = (
        f"{geo.moe_layers} layers x top-{geo.top_k} x (1 + {inp.spec_tokens} spec) "
        f"x min(seqs {inp.max_seqs}, 4) x gate_fp_max {inp.gate_fp_max} growth"
    )
    b.floor_holds = slots >= b.floor and not b.deficit
    b.short_slots = max(b.floor - slots, 0)
    b.max_context_for_floor = _max_context(geo, inp, card, slot_bytes, n_keys, b.floor)
    b.max_seqs_for_floor = _max_seqs(geo, inp, card, slot_bytes, n_keys)
    _explain(b, inp)
    return b


def _holds(geo, inp, card, slot_bytes, n_keys, context, seqs, floor) -> bool:
    items = _fixed(geo, inp, context, seqs)
    fixed = sum(x for _, x, _ in items)
    if fixed > card:
        return False
    slots = _pool_slots(geo, inp, items, card, slot_bytes, n_keys)
    return slots >= floor and fixed + slots * slot_bytes <= card


def _max_context(geo, inp, card, slot_bytes, n_keys, floor) -> int:
    """Largest context (tokens) at which the pool still clears the floor (0: none)."""
    if inp.kv_gb is not None:
        return (
            inp.context if _holds(geo, inp, card, slot_bytes, n_keys, inp.context, inp.max_seqs, floor) else 0
        )
    if not _holds(geo, inp, card, slot_bytes, n_keys, 1, inp.max_seqs, floor):
        return 0
    lo, hi = 1, max(inp.context, 1)
    while _holds(geo, inp, card, slot_bytes, n_keys, hi, inp.max_seqs, floor) and hi < 1 << 26:
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # KV grows with context: the first failing one, by bisection
        mid = (lo + hi) // 2
        lo, hi = (
            (mid, hi) if _holds(geo, inp, card, slot_bytes, n_keys, mid, inp.max_seqs, floor) else (lo, mid)
        )
    return lo


def _max_seqs(geo, inp, card, slot_bytes, n_keys) -> int:
    """Most sequences (up to max_seqs) at the context whose pool clears its floor."""
    best = 0
    for seqs in range(1, inp.max_seqs + 1):
        floor = sizing.fire_floor(geo.moe_layers, geo.top_k, inp.spec_tokens, seqs, inp.gate_fp_max)
        if _holds(geo, inp, card, slot_bytes, n_keys, inp.context, seqs, floor):
            best = seqs
        elif seqs > 4:  # the floor stops growing at 4 seqs; KV keeps growing
            break
    return best


def _explain(b: Budget, inp: Inputs) -> None:
    gib = lambda x: f"{x / GIB:.2f} GiB"  # noqa: E731
    if b.deficit:
        parts = ", ".join(f"{n} {gib(x)}" for n, x, _ in b.items if x)
        b.does_not_fit.append(f"the card ({gib(b.card)}) is {gib(b.deficit)} short: {parts}")
    if b.pool_slots < b.floor:
        b.does_not_fit.append(
            f"the pool ({b.pool_slots} slots) is {b.short_slots} slots "
            f"({gib(b.short_slots * b.slot_bytes)}) under the fire floor of {b.floor}"
        )
        if b.max_context_for_floor:
            b.does_not_fit.append(
                f"the floor holds up to a context of "
                f"{b.max_context_for_floor} tokens at {inp.max_seqs} seq(s)"
            )
        elif not b.deficit:
            b.does_not_fit.append(
                f"no context length makes the floor hold at {inp.max_seqs} "
                f"seq(s) and {inp.spec_tokens} spec token(s): the fixed "
                f"parts leave too little of the card"
            )
        if b.max_seqs_for_floor and b.max_seqs_for_floor < inp.max_seqs:
            b.does_not_fit.append(
                f"the floor holds up to {b.max_seqs_for_floor} sequence(s) at {inp.context} tokens"
            )

"""The exact settings a plan turns into, for vLLM-Moet (its ``VLLM_MOE_W2_*`` variables,
docs/VLLM_MOET.md and shared MOET-SURFACE.md section 3) and for upstream vLLM with
``--quantization tierstore`` (docs/VLLM.md), plus the vLLM flags both take.

Pool sizes are written in GiB the engines turn back into exactly the planned slots:
vLLM-Moet computes ``max(int(GB * 2^30) // slot_bytes, 8)``, tierstore
``sizing.slots_for_gib`` (the same), so the text is checked against that function.
"""

from __future__ import annotations

import json

from tierstore.plan.budget import Budget, Inputs, mtp_used
from tierstore.plan.geometry import Geometry
from tierstore.store import sizing

MOET_PREFIX = "VLLM_MOE_W2_"
MOET_DEFAULT_PREFILL_T = 96
# tierstore policy -> vLLM-Moet's DELTA_POLICY (the face maps freq / need; anything else
# is its lru-like rule); tierstore-only policies have no DELTA_POLICY spelling.
MOET_POLICIES = {"freq": "freq", "heat": "freq", "lru": "lru", "need": "need"}


def gib_text(slots: int, slot_bytes: int) -> str:
    """The shortest GiB text (4 decimals at most) that sizes exactly ``slots`` slots."""
    exact = slots * slot_bytes / sizing.GIB
    for digits in range(1, 7):
        text = f"{exact:.{digits}f}"
        for candidate in (text, f"{float(text) + 10**-digits:.{digits}f}"):
            if sizing.slots_for_gib(float(candidate), slot_bytes) == max(slots, sizing.MIN_SLOTS):
                return candidate
    return repr(exact)


def _nothing_fits(budget: Budget) -> dict | None:
    if budget.pool_slots >= 1:
        return None
    return {"env": {}, "args": [], "notes": ["no pool fits the card (see 'does not fit'): nothing to set"]}


def vllm_args(geo: Geometry, inp: Inputs, budget: Budget) -> list[str]:
    """vLLM serve flags the plan assumes (both engines)."""
    kv = next(b for n, b, _ in budget.items if n == "KV cache")
    args = [
        "--max-model-len",
        str(inp.context),
        "--max-num-seqs",
        str(inp.max_seqs),
        "--max-num-batched-tokens",
        str(max(inp.batched_tokens, inp.max_seqs * (1 + inp.spec_tokens))),
        "--kv-cache-memory-bytes",
        str(kv),
    ]
    if inp.gpu_util != 0.9:
        args += ["--gpu-memory-utilization", f"{inp.gpu_util:g}"]
    if inp.kv_dtype not in ("auto", "bf16", "fp16"):
        args += ["--kv-cache-dtype", inp.kv_dtype]
    if inp.spec_tokens:
        method = "mtp" if geo.mtp_layers else "ngram"
        args += [
            "--speculative-config",
            json.dumps({"method": method, "num_speculative_tokens": inp.spec_tokens}),
        ]
    return args


def moet_settings(
    geo: Geometry,
    inp: Inputs,
    budget: Budget,
    policy: str | None = None,
    force: bool = False,
    store_dir: str | None = None,
    slots: int | None = None,
) -> dict:
    """``slots``: the pool to set (default the budget's: the largest that fits);
    ``policy``: a tierstore policy, written as DELTA_POLICY when vLLM-Moet has one."""
    empty = _nothing_fits(budget)
    if empty is not None:
        return empty
    if inp.base_dtype == "none":
        return {
            "env": {},
            "args": [],
            "notes": [
                "vLLM-Moet serves from a resident base (its FP4 pool only recovers experts): "
                "with --base-dtype none use upstream vLLM, or plan a base "
                "(--base-dtype base2; VLLM_MOE_W2_BASE_CACHE_GB caches part of it)"
            ],
        }
    slots = budget.pool_slots if slots is None else int(slots)
    env = {
        "VLLM_MOE_W2": "1",
        MOET_PREFIX + "GATE": "1",
        MOET_PREFIX + "TIERSTORE": "1",
        MOET_PREFIX + "DELTA_GB": gib_text(slots, budget.slot_bytes),
        MOET_PREFIX + "NUM_LAYERS": str(geo.moe_layers),
    }
    notes = []
    if inp.slot_bytes is None and inp.expert_dtype == "fp4q":
        env[MOET_PREFIX + "DELTA_SPLIT"] = "1"  # standalone: 7.5 MiB quintal rows
    elif inp.slot_bytes is None and inp.expert_dtype != "fp4":
        notes.append(
            f"vLLM-Moet's FP4 tier holds fp4 (12 MiB at DS4) or, with DELTA_SPLIT=1, "
            f"fp4q rows, not {inp.expert_dtype}"
        )
    if inp.gate_fp_max != 3:
        env[MOET_PREFIX + "GATE_FP_MAX"] = str(inp.gate_fp_max)
    rows = inp.max_seqs * (1 + inp.spec_tokens)
    if rows > MOET_DEFAULT_PREFILL_T:
        env[MOET_PREFIX + "PREFILL_T"] = str(rows)  # must be >= max_num_seqs * (1 + n_spec)
    if policy is not None:
        moet = MOET_POLICIES.get(policy)
        if moet is not None:
            env[MOET_PREFIX + "DELTA_POLICY"] = moet
        else:
            notes.append(f"policy {policy!r} has no DELTA_POLICY spelling; vLLM-Moet's default (freq) stays")
    if store_dir:
        env[MOET_PREFIX + "STORE_DIR"] = store_dir
    if slots < budget.floor:
        if force:
            env[MOET_PREFIX + "FORCE_POOL"] = "1"
            notes.append("FORCE_POOL=1: serving under the fire floor (a warning at boot)")
        else:
            notes.append(
                "under the fire floor: vLLM-Moet refuses to boot with the gate on "
                "(see 'does not fit'; --force adds FORCE_POOL=1)"
            )
    if slots < sizing.MIN_SLOTS:
        notes.append(f"an explicit DELTA_GB gives at least {sizing.MIN_SLOTS} slots")
    return {"env": env, "args": vllm_args(geo, inp, budget), "notes": notes}


def vllm_settings(
    geo: Geometry, inp: Inputs, budget: Budget, policy: str | None = None, slots: int | None = None
) -> dict:
    empty = _nothing_fits(budget)
    if empty is not None:
        return empty
    slots = budget.pool_slots if slots is None else int(slots)
    env = {"TIERSTORE_VLLM_VRAM_GB": gib_text(slots, budget.slot_bytes)}
    if policy is not None:
        env["TIERSTORE_POOL_POLICY"] = policy
    args = ["--quantization", "tierstore", "--worker-cls", "tierstore.adapters.vllm_worker.TierstoreWorker"]
    notes = ["knobs as docs/VLLM.md lists them at this version"]
    if mtp_used(geo, inp):
        notes.append(f"MTP: {geo.mtp_layers} drafter layer(s) and their experts counted")
    return {"env": env, "args": args + vllm_args(geo, inp, budget), "notes": notes}


def shell_lines(settings: dict, model: str = "MODEL") -> list[str]:
    """``export K=V`` lines and the ``vllm serve`` line of one engine's settings."""
    if not settings["args"]:
        return []
    lines = [f"export {k}={v}" for k, v in settings["env"].items()]
    args = " ".join(a if " " not in a and '"' not in a else f"'{a}'" for a in settings["args"])
    return lines + [f"vllm serve {model} {args}"]

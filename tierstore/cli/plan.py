"""``tierstore plan``: how a MoE model's experts fit one card, and what to set.

Geometry from ``--config`` (a Hugging Face config.json: DeepSeek-V2/V3/V4, Mixtral,
Qwen2/3-MoE), ``--pack`` (layers, experts and the row size of a pack), or flags (which
override both). Prints the memory budget (non-expert weights, resident base, KV cache
at the context, activations, reserve, pool slots), the fire floor and whether it holds,
what does not fit and by how much, and the exact settings for vLLM-Moet and upstream
vLLM. With ``--trace`` (a capture-format routing trace: yours, from
``TIERSTORE_CAPTURE`` / ``VLLM_MOE_W2_DELTA_CAPTURE``), the hit rate against pool size
for each policy and MIN, and the recommended pool and policy (``--warm-out`` writes
that pool's hottest experts as a warm-start poolmon). ``--json`` / ``--png``.
Sizes are GiB (2^30 bytes). Exit 0 with a plan (also one that does not fit: it says so),
1 on bad input (one line), 2 on bad arguments.
"""

from __future__ import annotations

import json
import sys
import time

from tierstore.cli.args import existing_file, existing_path, float_in, int_in, names_of, output_file, say
from tierstore.errors import ConfigError

DEFAULT_PLAN_POLICIES = "lru,heat,hybrid,auto,freq"


def register(groups) -> None:
    from tierstore.plan.budget import BASE_DTYPES, DENSE_DTYPES, EXPERT_DTYPES, KV_DTYPES

    p = groups.add_parser(
        "plan",
        help="size the expert pool for one card (and replay a trace)",
        description=__doc__.split("\n\n")[0].split(": ", 1)[1],
    )
    src = p.add_argument_group("model geometry (a config, a pack, and/or flags)")
    src.add_argument(
        "--config",
        type=existing_file("config.json"),
        help="Hugging Face config.json of the model (default: none)",
    )
    src.add_argument(
        "--pack",
        type=existing_path("pack file or directory"),
        help="a pack: its layers, experts and row size (slot bytes) (default: none)",
    )
    src.add_argument(
        "--model", default=None, help="model name for the vllm serve line (default: the config's name)"
    )
    for flag, hi, text in (
        ("--layers", 4096, "MoE layers"),
        ("--experts", 1 << 16, "routed experts per layer"),
        ("--top-k", 1 << 16, "experts routed per token"),
        ("--hidden", 1 << 20, "hidden size"),
        ("--moe-intermediate", 1 << 20, "one expert's intermediate size"),
        ("--dense-layers", 4096, "dense (non-MoE) layers"),
        ("--shared-intermediate", 1 << 22, "all shared experts' width"),
        ("--vocab", 1 << 24, "vocabulary size"),
        ("--kv-heads", 4096, "KV heads (GQA)"),
        ("--head-dim", 1 << 16, "head dim"),
        ("--mtp-layers", 64, "MTP layers"),
    ):
        src.add_argument(
            flag,
            type=int_in(1 if flag in ("--layers", "--experts", "--top-k", "--hidden") else 0, hi),
            default=None,
            help=f"{text} (default: from --config / --pack)",
        )
    mem = p.add_argument_group("card and serving shape")
    mem.add_argument(
        "--card-gb",
        type=float_in(0.0, 1 << 20, lo_open=True),
        required=True,
        help="card memory in GiB (96 GB RTX PRO 6000: 95.59; 32 GB RTX 5090: 31.84)",
    )
    mem.add_argument("--context", type=int_in(1, 1 << 24), default=8192, help="tokens per sequence")
    mem.add_argument("--max-seqs", type=int_in(1, 1 << 16), default=1, help="concurrent sequences")
    mem.add_argument(
        "--spec-tokens",
        type=int_in(0, 64),
        default=0,
        help="speculative tokens per step (MTP when the model has MTP layers)",
    )
    mem.add_argument("--kv-dtype", choices=sorted(KV_DTYPES), default="auto", help="KV cache dtype")
    mem.add_argument(
        "--expert-dtype",
        choices=sorted(EXPERT_DTYPES),
        default="fp4",
        help="pool row format (fp4: vLLM-Moet's 12 MiB DS4 rows)",
    )
    mem.add_argument(
        "--base-dtype",
        choices=list(BASE_DTYPES),
        default="base2",
        help="resident copy of every routed expert (none: the pool is the only one)",
    )
    mem.add_argument(
        "--dense-dtype",
        choices=sorted(DENSE_DTYPES),
        default=None,
        help="non-expert weights (default: fp8 when the checkpoint is, else bf16)",
    )
    mem.add_argument(
        "--gpu-util",
        type=float_in(0.0, 1.0, lo_open=True),
        default=0.9,
        help="vLLM's --gpu-memory-utilization: the rest of the card stays unused",
    )
    mem.add_argument(
        "--reserve-gb",
        type=float_in(0.0, 1 << 20),
        default=0.0,
        help="left free beyond (1 - gpu-util) x card",
    )
    mem.add_argument(
        "--batched-tokens",
        type=int_in(1, 1 << 24),
        default=2048,
        help="max tokens per forward (--max-num-batched-tokens)",
    )
    mem.add_argument(
        "--gate-fp-max",
        type=int_in(1, 64),
        default=3,
        help="promote -> replay rounds (the floor's growth term)",
    )
    mem.add_argument(
        "--pool-gb",
        type=float_in(0.0, 1 << 20, lo_open=True),
        default=None,
        help="a fixed pool in GiB (default: the largest that fits)",
    )
    mem.add_argument(
        "--dense-gb",
        type=float_in(0.0, 1 << 20),
        default=None,
        help="measured non-expert weights (default: an estimate from the geometry)",
    )
    mem.add_argument(
        "--kv-gb",
        type=float_in(0.0, 1 << 20),
        default=None,
        help="measured KV cache (default: from the geometry and the context)",
    )
    mem.add_argument(
        "--activation-gb",
        type=float_in(0.0, 1 << 20),
        default=None,
        help="measured activation peak (default: an estimate)",
    )
    mem.add_argument(
        "--force", action="store_true", help="settings that serve under the fire floor (FORCE_POOL=1)"
    )
    tr = p.add_argument_group("routing trace (hit rate vs pool)")
    from tierstore.cli.bench_hits import trace_file

    tr.add_argument(
        "--trace", type=trace_file, help="int32 .npy rows [tick, layer, expert] (default: none, no curve)"
    )
    tr.add_argument(
        "--policies",
        type=names_of(_plan_policies(), "policy"),
        default=DEFAULT_PLAN_POLICIES.split(","),
        help=f"policies to replay (MIN always; default: {DEFAULT_PLAN_POLICIES})",
    )
    tr.add_argument(
        "--view", choices=["latency", "bandwidth"], default="latency", help="hit rate the recommendation uses"
    )
    tr.add_argument(
        "--tolerance", type=float_in(0.0, 0.5), default=0.01, help="hit rate given up for a smaller pool"
    )
    tr.add_argument("--points", type=int_in(2, 64), default=12, help="pool sizes on the grid")
    tr.add_argument(
        "--warm-out",
        type=output_file("warm-start file"),
        default=None,
        help="write the recommended pool's hottest experts as a poolmon (default: none)",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument(
        "--png",
        type=output_file("PNG file"),
        default=None,
        help="write a PNG: the budget, and the hit-rate curves with --trace (default: none)",
    )
    p.set_defaults(func=main)


def _plan_policies() -> list[str]:
    from tierstore import policies

    return [p for p in policies.available()]


def _geometry(args):
    from tierstore.plan.geometry import Geometry, from_hf_config, from_pack

    geo, pack_info = None, None
    if args.config:
        geo = from_hf_config(args.config)
    if args.pack:
        pack_info = from_pack(args.pack)
        pack_info["pack"].close()
    flags = dict(
        moe_layers=args.layers,
        n_experts=args.experts,
        top_k=args.top_k,
        hidden=args.hidden,
        moe_intermediate=args.moe_intermediate,
        dense_layers=args.dense_layers,
        shared_intermediate=args.shared_intermediate,
        vocab=args.vocab,
        kv_heads=args.kv_heads,
        head_dim=args.head_dim,
        mtp_layers=args.mtp_layers,
    )
    if geo is None:
        base = {"moe_layers": 0, "n_experts": 0, "top_k": 0, "hidden": 0}
        if pack_info is not None:
            base.update(moe_layers=pack_info["moe_layers"], n_experts=pack_info["n_experts"])
        given = {k: v for k, v in flags.items() if v is not None}
        missing = (
            [f"--{k.replace('_', '-')}" for k in ("top_k", "hidden") if k not in given]
            + ([] if pack_info or "moe_layers" in given else ["--layers"])
            + ([] if pack_info or "n_experts" in given else ["--experts"])
        )
        if missing:
            raise ConfigError(f"tierstore plan: give --config, or {', '.join(missing)}")
        geo = Geometry(
            **{**base, **given, "kv_heads": given.get("kv_heads", 1), "head_dim": given.get("head_dim", 128)}
        )
    else:
        geo = geo.with_overrides(**flags)
    if pack_info is not None:
        rows = (geo.moe_layers, geo.moe_layers + geo.mtp_layers)
        if pack_info["n_experts"] != geo.n_experts or pack_info["moe_layers"] not in rows:
            raise ConfigError(
                f"{args.pack}: {pack_info['moe_layers']} layers x "
                f"{pack_info['n_experts']} experts, the model has "
                f"{geo.moe_layers} MoE layers x {geo.n_experts}"
            )
    return geo.check("tierstore plan"), pack_info


def build(args) -> dict:
    """The plan as a dict (what --json prints)."""
    from tierstore.plan import budget as bmod
    from tierstore.plan import engines

    geo, pack_info = _geometry(args)
    inp = bmod.Inputs(
        card_gb=args.card_gb,
        context=args.context,
        max_seqs=args.max_seqs,
        spec_tokens=args.spec_tokens,
        kv_dtype=args.kv_dtype,
        expert_dtype=args.expert_dtype,
        base_dtype=args.base_dtype,
        dense_dtype=args.dense_dtype,
        reserve_gb=args.reserve_gb,
        gpu_util=args.gpu_util,
        batched_tokens=args.batched_tokens,
        gate_fp_max=args.gate_fp_max,
        pool_gb=args.pool_gb,
        dense_gb=args.dense_gb,
        kv_gb=args.kv_gb,
        activation_gb=args.activation_gb,
        slot_bytes=pack_info["slot_bytes"] if pack_info else None,
    )
    if not geo.moe_intermediate and not inp.slot_bytes:
        raise ConfigError(
            "tierstore plan: give --moe-intermediate (or --config / --pack) to size an expert row"
        )
    budget = bmod.plan_memory(geo, inp)
    plan = {
        "geometry": geo.as_dict(),
        "inputs": {k: v for k, v in vars(inp).items()},
        "budget": budget.as_dict(),
        "curve": None,
    }
    policy = moet_policy = slots = None
    if args.trace:
        from tierstore.plan.curve import hit_curve
        from tierstore.sim.traces import load_trace

        trace = load_trace(args.trace)
        t0 = time.perf_counter()
        curve = hit_curve(
            trace,
            model_keys=budget.n_keys,
            feasible_model_slots=budget.pool_slots,
            floor_model_slots=budget.floor,
            policies=args.policies,
            view=args.view,
            tolerance=args.tolerance,
            points=args.points,
            progress=lambda s: say(f"[plan] replayed {len(args.policies) + 1} models at {s} slots"),
        )
        plan["curve"] = curve.as_dict()
        plan["curve"]["seconds"] = time.perf_counter() - t0
        rec = curve.recommended
        if rec:
            policy, slots = rec["policy"], rec["model_slots"]
            moet_policy = _best_moet_policy(curve, rec["slots"])
        if args.warm_out:
            _write_warm(args, trace, curve, geo, inp, pack_info)
    store_dir = None
    if args.pack:
        import os

        store_dir = args.pack if os.path.isdir(args.pack) else os.path.dirname(os.path.abspath(args.pack))
    plan["settings"] = {
        "vllm_moet": engines.moet_settings(
            geo, inp, budget, policy=moet_policy, force=args.force, store_dir=store_dir, slots=slots
        ),
        "vllm": engines.vllm_settings(geo, inp, budget, policy=policy, slots=slots),
    }
    plan["model"] = args.model or geo.name or "MODEL"
    return plan


def _best_moet_policy(curve, slots: int) -> str | None:
    """The best policy at ``slots`` that vLLM-Moet's DELTA_POLICY can name."""
    from tierstore.plan.engines import MOET_POLICIES

    at = [r for r in curve.results if r.slots == slots and r.policy in MOET_POLICIES]
    return max(at, key=curve.hit).policy if at else None


def _write_warm(args, trace, curve, geo, inp, pack_info) -> None:
    from tierstore.plan import warm_file_from_trace
    from tierstore.warm import write_warm_file
    from tierstore.warm.formats import PackIdentity

    if curve.recommended is None:
        raise ConfigError(f"--warm-out {args.warm_out}: no pool fits the card, nothing to warm")
    if pack_info is not None:
        from tierstore.format.pack import Pack

        with_pack = Pack.open(args.pack)
        try:
            ident = PackIdentity.of_pack(with_pack)
        finally:
            with_pack.close()
    else:  # no pack: the identity the planned pack will have (tag = the row format)
        from tierstore.plan.budget import expert_row_bytes, mtp_used

        ident = PackIdentity(
            tag=inp.expert_dtype,
            n_layers=geo.moe_layers + mtp_used(geo, inp),
            n_experts=geo.n_experts,
            slot_bytes=inp.slot_bytes or expert_row_bytes(geo, inp.expert_dtype),
        )
    wf = warm_file_from_trace(trace, curve.recommended["slots"], ident)
    wf.wall_time = time.time()
    write_warm_file(wf, args.warm_out, "poolmon", ident)


def main(args) -> int:
    plan = build(args)
    if args.png:
        from tierstore.cli.plan_report import plot

        plot(plan, args.png)
    if args.json:
        json.dump(plan, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    else:
        from tierstore.cli.plan_report import print_plan

        print_plan(plan)
    return 0

"""tierstore as a drop-in tier store for vLLM-Moet (the fork), replayed without vLLM.

    python examples/vllm_moet_dropin.py [--device cpu|cuda] [--steps 8] [--graph]

Integration 1 of 2 (the other: examples/vllm_quant_method.py, stock vLLM).

What the fork does, and what to change
--------------------------------------
vLLM-Moet configures its FP4 "recovery" pool with VLLM_MOE_W2_* variables and
calls a tier object from its fused-MoE glue and its model runner. tierstore reads
the same variables (``config_from_env``; every documented one, bad values in one
error) and exposes the same surface, so the fork's tier is replaced by::

    from tierstore.adapters.vllm_moet import MoetTier
    tier = MoetTier.from_env(device="cuda", rank=tp_rank, world=tp_size)
    # after the KV cache is allocated, before CUDA-graph capture:
    tier.finalize_auto()                             # VLLM_MOE_W2_DELTA_GB=auto
    tier.check_pool_floor(top_k, n_spec, max_num_seqs)   # after sizing (FORCE_POOL honoured)
    tier.preload_pool()                              # pool-heat warm start (POOL_HEAT=1)

    # fused-MoE glue, per MoE layer (inside the captured graph for decode):
    tier.mark_seen(layer, topk_ids)                  # device ops only
    out = tier.moe_w2_forward(x, topk_weights, topk_ids, layer)
    # prefill, eager, before the layer's forward:
    tier.ensure_resident(layer, topk_ids)

    # model runner, per decode step:
    tier.wait_manager_idle(timeout); tier.step_begin()
    logits = run_graph()
    if gate.should_fire(logits):                     # tierstore.gate.UncertaintyGate
        tier.force_promote(); logits = run_graph()   # up to 3 rounds
    tier.step_end()

The fork's store backends call ``tier.backend().rows_for(pairs, scan=False)`` to
read rows with tierstore's threaded pread / O_DIRECT engine. The pack directory
(VLLM_MOE_W2_STORE_DIR) holds an ``fp4`` pack (pool rows) and a ``base`` pack
(the 2-bit rows every expert falls back to). Policy names map freq->heat,
need->hybrid, lru->lru (tierstore/adapters/moet_config.py).

This script builds such a directory from a small generated model, sets the
environment the way a deployment would, and replays the runner's call sequence
(``tierstore.adapters.moet_runner.EngineReplay``); ``--graph`` (CUDA) captures the
decode forward in a CUDA graph once and replays it across promotions.
"""
from __future__ import annotations

import argparse
import os
import tempfile

import torch

from tierstore.testing.moet_runner import EngineReplay, TinyDecoder
from tierstore.adapters.vllm_moet import MoetTier
from tierstore.compute.gate import UncertaintyGate
from tierstore.testing.model import make_moe_model, write_model_packs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--graph", action="store_true", help="capture the decode step (CUDA)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)          # tiny tensors: intra-op threads only add overhead

    with tempfile.TemporaryDirectory() as store_dir:
        model = make_moe_model(args.layers, args.experts, H=128, I=128, seed=0)
        write_model_packs(model, store_dir)
        slot_bytes = model.fp4_bytes
        # the deployment's environment (a real one sets these in the service unit)
        env = dict(os.environ)
        env.update({
            "VLLM_MOE_W2_STORE_DIR": store_dir,
            "VLLM_MOE_W2_DELTA_GB": "auto",
            "VLLM_MOE_W2_DELTA_RESERVE_GB": "0",
            "VLLM_MOE_W2_DELTA_MAX_GB": repr(24 * slot_bytes / 2**30),   # a 24-slot pool
            "VLLM_MOE_W2_DELTA_POLICY": "freq",
            "VLLM_MOE_W2_GATE_MAX_PROMOTE": "16",
            "VLLM_MOE_W2_BASE_RAM_GB": "0.01",
            "VLLM_MOE_W2_POOL_HEAT_EVERY_S": "3600",
        })
        tier = MoetTier.from_env(env, device=args.device)
        with tier:
            tier.check_pool_floor(top_k=args.top_k)          # deferred: the pool is "auto"
            n = tier.finalize_auto(free_bytes=2**40)         # as if after the KV cache
            print(f"pool: {n} slots of {slot_bytes} bytes (auto, capped by DELTA_MAX_GB); "
                  f"preloaded {tier.preload_pool()} from pool heat")
            gate = UncertaintyGate("top1", tau=0.60)
            replay = EngineReplay(tier, TinyDecoder(model, args.top_k, device=args.device),
                                  gate, max_rounds=3, graph=args.graph)
            replay.prefill(model.tokens(32, seed=1).to(args.device))
            for step in range(args.steps):
                replay.decode(model.tokens(2, seed=100 + step).to(args.device))
                h = replay.history[-1]
                conf = " -> ".join(f"{c:.3f}" for c in h.confidence)
                print(f"step {step}: {'FIRE' if h.fired else 'ok  '} rounds={h.rounds} "
                      f"promoted={h.promoted} min top-1 {conf}")
            g, s = gate.stats(), tier.store.stats()
            print(f"gate: {g.steps} steps, fire rate {g.fire_rate:.2f}, "
                  f"{g.rounds_per_fire:.2f} rounds and {g.promoted_per_fire:.1f} promoted per fire")
            print(f"store: pool hit rate {s.pool.hit_rate:.2f}, fire p50 {s.fire_p50_ms:.2f} ms, "
                  f"{s.lazy_queued} lazy promotions queued")
            rows = tier.backend().rows_for([(0, 0), (1, 3)], scan=True)
            print(f"backend rows_for: {len(rows)} rows of {rows[0].nbytes} bytes")
        print("pool heat written:", sorted(f for f in os.listdir(store_dir) if f.startswith("pool-heat")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

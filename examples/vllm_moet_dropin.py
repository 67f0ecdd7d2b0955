"""tierstore as vLLM-Moet's FP4 tier, replayed without vLLM (the engine's exact calls).

    python examples/vllm_moet_dropin.py [--device cpu|cuda] [--steps 8] [--graph]

Integration 1 of 2 (the other: examples/vllm_quant_method.py, stock vLLM).

In a real deployment nothing is patched: ``pip install tierstore`` next to
vLLM-Moet and set ``VLLM_MOE_W2_TIERSTORE=1``. tierstore's ``vllm.general_plugins``
entry point then installs ``tierstore.adapters.vllm_moet.get_tier`` (and
``shutdown`` / ``check_pool_floor``) into vLLM-Moet's ``moe_w2_delta`` module in
every worker, before the model is built, and every caller gets tierstore's tier:

    tier = moe_w2_delta.get_tier(n_experts=E, dev=dev, w13_bytes=..., w2_bytes=...)
    tier.add_layer_host_planes(layer_key, w13_gpu, w2_gpu)    # first boot writes the pack
    moe_w2_delta.check_pool_floor(top_k, n_spec, max_num_seqs) # V1 runner, end of load
    moe_w2_delta.mark_seen(tier.seen[layer_key], topk_ids.view(-1).long())  # in graph
    tier.finalize_auto()                                      # worker, after the KV cache
    per step: tier.wait_manager_idle(); forward; on a gate fire up to GATE_FP_MAX rounds of
              force_promote_step(max_promote=budget) + replay; tier.step_end()
    moe_w2_delta.shutdown()

This script writes random FP4 planes for a few layers, sets the VLLM_MOE_W2_*
environment a deployment would, and drives ``tierstore.adapters.vllm_moet`` with
``tierstore.testing.moet_engine.MoetEngine`` (the glue / gate / runner / worker
calls, in order), checking after every step that each mapped pool slot holds
exactly its row of the pack on disk. A second boot finds the pack and skips the
layers. ``--graph`` (CUDA) captures the forward with capture_error_mode="global".
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch

P = "VLLM_MOE_W2_"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--graph", action="store_true")
    args = ap.parse_args()
    from tierstore.adapters import vllm_moet as moe_w2_delta
    from tierstore.format.pack import Pack
    from tierstore.testing.moet_engine import MoetEngine

    w13, w2 = 8192, 4096
    g = torch.Generator().manual_seed(0)
    planes = {
        k: (
            torch.randint(0, 256, (args.experts, w13), dtype=torch.uint8, generator=g),
            torch.randint(0, 256, (args.experts, w2), dtype=torch.uint8, generator=g),
        )
        for k in range(args.layers)
    }
    store_dir = tempfile.mkdtemp(prefix="tierstore-moet-")
    slots = max(int(args.layers * 2 * 2 * 1.7) + 2, 8)
    os.environ.update(
        {
            P + "STORE_DIR": store_dir,
            P + "CKPT_ID": "example-ckpt",
            P + "NUM_LAYERS": str(args.layers - 1),
            P + "GATE": "1",
            P + "DELTA_GB": repr(slots * (w13 + w2) / 2**30),
        }
    )
    for boot in (1, 2):
        moe_w2_delta.reset_env()
        eng = MoetEngine(
            moe_w2_delta,
            planes,
            n_experts=args.experts,
            dev=args.device,
            top_k=2,
            tokens=2,
            graphs=args.graph,
        ).boot()
        tier = moe_w2_delta._TIER
        pack = Pack.open(tier._store.path)
        print(
            f"boot {boot}: pack {os.path.basename(pack.path)} holds {int(pack.written.sum())}/"
            f"{args.layers} layers; pool {tier.n_slots} slots x {tier.slot_bytes} bytes"
        )
        for i in range(args.steps):
            rec = eng.step(fire=True)
            mapped = eng.check(lambda li, ei: torch.from_numpy(pack.read_row(li, ei).copy()))
            print(
                f"step {i}: promoted {rec['promoted']} in {rec['rounds']} replays, "
                f"{mapped} experts mapped, pool == pack"
            )
        eng.shutdown()
    print("shutdown: moe_w2_delta._TIER is", moe_w2_delta._TIER)


if __name__ == "__main__":
    main()

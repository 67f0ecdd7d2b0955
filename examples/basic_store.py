"""tierstore in a few lines: packs, an ExpertStore, a fire, the slot-aware MoE.

    python examples/basic_store.py [--device cpu|cuda] [--layers 4 --experts 16]

1. Generate a small MoE model (heavy-tailed weights, real MXFP4 and 2-bit
   quantisation) and write its ``fp4`` and ``base`` packs (pack + JSON sidecar).
2. Open an ``ExpertStore`` over the FP4 pack: a fixed-slot pool (on the GPU, or
   in host memory with ``--device cpu``), a pinned RAM arena, the pack on disk.
3. Route a few tokens, ``record`` the routing (heat), ``fire`` the routed experts
   (synchronous promotion, pinned), run ``fused_moe`` and ``release``.
4. Compare the MoE output with the full-precision experts: 2-bit base alone vs
   with the routed experts promoted to FP4.

Runs on the CPU in about a second.
"""

from __future__ import annotations

import argparse
import tempfile

import torch

import tierstore as ts
from tierstore.compute.model import make_moe_model, write_model_packs
from tierstore.compute.moe import BaseWeights, dense_moe


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=4)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # tiny tensors: intra-op threads only add overhead

    with tempfile.TemporaryDirectory() as d:
        # 1. a model and its packs
        model = make_moe_model(args.layers, args.experts, H=128, I=128, seed=0)
        fp4_path, base_path = write_model_packs(model, d)
        pack = ts.Pack.open(fp4_path)
        print(
            f"pack: {pack.n_layers} layers x {pack.n_experts} experts, "
            f"{pack.slot_bytes} bytes a row (stride {pack.stride})"
        )
        base = BaseWeights.from_pack(ts.Pack.open(base_path), device=args.device)

        # 2. the store: room for a quarter of the experts in the pool
        slots = max(8, pack.n_layers * pack.n_experts // 4)
        with ts.ExpertStore(pack, vram_slots=slots, ram_gb=0.01, device=args.device, policy="heat") as store:
            x = model.tokens(args.tokens).to(args.device)
            layer = 0
            w, ids = model.route(x.cpu(), layer, args.top_k)
            w, ids = w.to(args.device), ids.to(args.device)

            # 3. record routing, run on the base, fire, run again
            store.record(layer, ids)
            before = ts.fused_moe(x, w, ids, layer, store, base)
            routed = torch.stack([torch.full_like(ids.reshape(-1), layer), ids.reshape(-1)], 1)
            fire = store.fire(routed)
            after = ts.fused_moe(x, w, ids, layer, store, base)
            store.release(fire)
            store.step()

            # 4. the point of the pool
            ref = dense_moe(x.cpu(), w.cpu(), ids.cpu(), model.w13[layer], model.w2[layer])
            err = lambda out: float((out.cpu().double() - ref).norm() / ref.norm())  # noqa: E731
            print(
                f"fire: promoted {fire.promoted} experts in {fire.latency_s * 1e3:.2f} ms "
                f"(sources {fire.sources})"
            )
            print(
                f"relative error vs full precision: 2-bit base {err(before):.4f}, "
                f"with FP4 promotions {err(after):.4f}"
            )
            s = store.stats()
            print(
                f"stats: pool {s.pool.resident}/{s.pool.capacity} resident, "
                f"arena {s.arena.resident}/{s.arena.capacity}, fires {s.fires}"
            )
            assert err(after) < err(before)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

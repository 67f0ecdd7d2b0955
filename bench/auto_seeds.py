"""auto (a variant of its module constants) minus the best fixed policy in hindsight, bandwidth
view, over hits_eval's synthetic settings at several seeds, and FLAME (10/20/40 % pools).

    PYTHONPATH=$PWD python3 bench/auto_seeds.py '{}' 0,1          # the shipped auto, tune seeds
    PYTHONPATH=$PWD python3 bench/auto_seeds.py '{"shl": 8, "core": {"LONG_SCORE_HALF_LIFE": 128},
        "experts": [...]}' 2,3                                   # a variant, held-out seeds

VARIANT: "experts" (EXPERTS), "shl" (SCORE_HALF_LIFE), "core" (other auto.py constants)."""
import sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
import auto_seeds_grid as G  # noqa: E402
from tierstore import sim
var = G.apply_variant(sys.argv[1]); seeds = [int(s) for s in sys.argv[2].split(",")]
names = sys.argv[3].split(",") if len(sys.argv) > 3 else ["flame"] + list(G.SETTINGS)
t = time.process_time(); tot = []; rows = {}
for name in names:
    for seed in ([0] if name == "flame" else seeds):
        g = G.grid(name, seed); prep = sim.Prepared(G.make(name, seed))
        for r in sim.replay(prep, ["auto"], g["slots"]):
            best = max(x[3] for x in g["all"] if x[2] == r.slots)
            d = r.bandwidth_hit_rate - best; tot.append(d); rows[f"{name}/{seed}/{r.slots}"] = d
    print(name, " ".join(f"{v:+.4f}" for k, v in rows.items() if k.startswith(name + "/")), flush=True)
print(f"VARIANT {sys.argv[1]} seeds {seeds}: sum {sum(tot):+.4f} min {min(tot):+.4f} n>=0 {sum(d>=-1e-12 for d in tot)}/{len(tot)} ({time.process_time()-t:.0f}s)")

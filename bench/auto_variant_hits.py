"""`tierstore bench hits` with auto.py's constants set to a variant first (same VARIANT form as
bench/auto_seeds.py), so a variant's latency/bandwidth views are measured without editing the
shipped defaults. auto+prefetch's base is the same AutoPolicy, so it takes the variant too.

    PYTHONPATH=$PWD python3 bench/auto_variant_hits.py '{"shl": 8, ...}' \\
        --trace /work/shared/traces/flame_moe_290m_pretrain_2048tok.npy --slots 51,102,205 \\
        --policies lru,auto,belady,auto+prefetch

VARIANT: "experts" (EXPERTS), "shl" (SCORE_HALF_LIFE), "core" (other auto.py constants);
the remaining arguments are `tierstore bench hits`'s."""
import json, sys
import tierstore.policies.auto as A
from tierstore.cli import main

var = json.loads(sys.argv[1])
if "experts" in var: A.EXPERTS = tuple((n, None if h is None else float(h)) for n, h in var["experts"])
if "shl" in var: A.SCORE_HALF_LIFE = float(var["shl"])
for k, v in var.get("core", {}).items():
    if not hasattr(A, k): sys.exit(f"auto.py has no constant {k!r}")
    setattr(A, k, v)
print(f"VARIANT {sys.argv[1]}", flush=True)
sys.exit(main(["bench", "hits"] + sys.argv[2:]))

"""`tierstore bench hits` with auto.py's constants set to a variant first (same VARIANT form as
bench/auto_seeds.py), so a variant's latency/bandwidth views are measured without editing the
shipped defaults. auto+prefetch's base is AutoPolicy(prefetching=True): "shl" and the long window
reach it only through PREFETCH_SCORE_HALF_LIFE / PREFETCH_LONG_SCORE_HALF_LIFE in "core".

    PYTHONPATH=$PWD python3 bench/auto_variant_hits.py '{"shl": 8, ...}' \\
        --trace /work/shared/traces/flame_moe_290m_pretrain_2048tok.npy --slots 51,102,205 \\
        --policies lru,auto,belady,auto+prefetch

VARIANT: "experts" (EXPERTS), "shl" (SCORE_HALF_LIFE), "core" (other auto.py constants);
the remaining arguments are `tierstore bench hits`'s."""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
import auto_seeds_grid as G  # noqa: E402
from tierstore.cli import main  # noqa: E402

G.apply_variant(sys.argv[1])
print(f"VARIANT {sys.argv[1]}", flush=True)
sys.exit(main(["bench", "hits"] + sys.argv[2:]))

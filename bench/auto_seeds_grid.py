"""The hindsight grid (bench/hits_eval.py FIXED x SWEEP, and lru) of each synthetic setting
of hits_eval (DS4 seed-0 shape and the held-out ones, any seed) and FLAME, cached in
/tmp/auto_seeds; used by bench/auto_seeds.py."""
import json, sys, time
from pathlib import Path
Path('/tmp/auto_seeds').mkdir(exist_ok=True)
sys.path.insert(0, str(Path(__file__).resolve().parent))
import hits_eval as H
from tierstore import sim
from tierstore.sim import synth, traces
SETTINGS = {"ds4": dict(n_ticks=256, prefill_tokens=256, prefill_every=1024)}
for k, kw in [kv for kv in H.HELDOUT.items() if kv[0] != "heldout_seed1"]:
    kw = dict(kw); kw.pop("seed"); SETTINGS[k.split("_", 2)[-1] if k.count("_") > 1 else "seed1"] = kw
SETTINGS = {("ds4" if k=="ds4" else k): v for k, v in SETTINGS.items()}
def apply_variant(text):
    """Set auto.py's constants to VARIANT, JSON text of a dict ("experts" -> EXPERTS,
    "shl" -> SCORE_HALF_LIFE, "core" -> any other constant), so a variant is measured
    without editing the shipped defaults (auto_seeds.py, auto_variant_hits.py). Returns
    the dict; exits with a one-line message on text that is not such a dict."""
    import tierstore.policies.auto as A
    try:
        var = json.loads(text)
    except ValueError as e:
        sys.exit(f"VARIANT is not JSON ({e}): {text!r}")
    if not isinstance(var, dict):
        sys.exit(f"VARIANT must be a JSON object, got {text!r}")
    if "experts" in var:
        A.EXPERTS = tuple((n, None if h is None else float(h)) for n, h in var["experts"])
    if "shl" in var:
        A.SCORE_HALF_LIFE = float(var["shl"])
    for k, v in var.get("core", {}).items():
        if not hasattr(A, k):
            sys.exit(f"auto.py has no constant {k!r}")
        setattr(A, k, v)
    return var


def make(name, seed):
    if name == "flame": return traces.load_trace(H.FLAME)
    return synth.synthetic_trace(**SETTINGS[name], seed=seed)
def grid(name, seed):
    p = Path(f"/tmp/auto_seeds/grid_{name}_{seed}.json")
    if p.exists(): return json.loads(p.read_text())
    tr = make(name, seed); prep = sim.Prepared(tr)
    slots = [max(1, round(tr.n_keys * f)) for f in (0.1, 0.2, 0.4)]
    out = {"slots": slots, "best": {}, "lru": {}}
    res = []
    for r in sim.replay(prep, ["lru"], slots): res.append(("lru", None, r.slots, r.bandwidth_hit_rate))
    for h in H.SWEEP:
        params = {f: {"half_life": h} for f in H.FIXED[1:]}
        for r in sim.replay(prep, list(H.FIXED[1:]), slots, policy_params=params):
            res.append((r.policy, h, r.slots, r.bandwidth_hit_rate))
    out["all"] = res
    p.write_text(json.dumps(out)); return out
if __name__ == "__main__":
    print(list(SETTINGS))
    t = time.process_time()
    for name in sys.argv[1].split(","):
        for seed in [int(s) for s in sys.argv[2].split(",")]:
            grid(name, seed); print(name, seed, f"{time.process_time()-t:.0f}s", flush=True)

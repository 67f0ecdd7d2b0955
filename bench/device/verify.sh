#!/usr/bin/env bash
# One device call for checksums on load (issue 41: every read from disk or page cache is
# verified, verify="always" is the default): build sm_90, the verify tests on the GPU, then
# bench/bench_verify.py's always-against-off fire on the CUDA pool, in one run: 12 MiB rows
# (DS4's FP4 expert), 40 MiB rows through the pinned staging ring, and 12 MiB rows served
# through an arena. JSON lands in $OUT (verify_12mib.json, verify_40mib.json,
# verify_12mib_arena.json); the medians and ratios go into bench/RESULTS.md.
#   bash bench/device/verify.sh
LIMIT=${LIMIT:-285}   # seconds for the whole script (the call's timeout_s is 300)
STAMP=verify GPU_TESTS="tests/io/test_verify_store_big.py tests/io/test_engine_gpu_checks.py tests/io/test_integrity.py" TEST_TIMEOUT=120
source "$(dirname "$0")/prelude.sh"
run() {   # NAME ARGS...: one bench_verify run, bounded by what is left of LIMIT
  local name=$1; shift
  stamp "bench verify $name"
  timeout $(( LIMIT - $(date +%s) + t0 )) python3 bench/bench_verify.py --dir /tmp/tierstore-bench-verify \
    --device cuda --repeats 7 --json "$OUT/verify_$name.json" "$@" > "$OUT/verify_$name.log" 2>&1
  echo "rc=$?"
  python3 - "$OUT/verify_$name.json" <<'PY' || tail -5 "$OUT/verify_$name.log"
import json, sys
res = json.load(open(sys.argv[1]))
for mode, (r,) in res["modes"].items():
    print(f"{mode:7s} median {r['median_ms']:8.2f} ms  {r['gbps']:6.2f} GB/s  x{r['ratio_to_off']:.3f} of off  verified_rows {r['verified_rows']}")
PY
}
run 12mib --rows 64 --row-mib 12
run 40mib --rows 24 --row-mib 40
run 12mib_arena --rows 64 --row-mib 12 --ram-gb 1
stamp done

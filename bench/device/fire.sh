#!/usr/bin/env bash
# One device call for store-level fires: build sm_90, the fire-path tests, then
# `tierstore bench fire` with --drop-caches (JSON, PNG, log under $OUT).
# Carry .whl (msgspec) and, for the kvikio baselines, .whl-kvikio (kvikio-cu13,
# libkvikio-cu13, rapids-logger; installed --no-deps).
#   bash bench/device/fire.sh            (BENCH_ARGS: more `bench fire` flags)
STAMP=fire EXTRA_WHEELS=${EXTRA_WHEELS:-.whl-kvikio} TEST_TIMEOUT=150
GPU_TESTS="tests/store/test_fire_pipelined.py tests/store/test_store_gpu.py tests/cli/test_bench_fire.py tests/store/test_store_faults.py"
source "$(dirname "$0")/prelude.sh"
python3 -c "import kvikio; print('kvikio', kvikio.__version__)" 2>&1 | tail -1
stamp "bench fire"
timeout ${BENCH_TIMEOUT:-330} python3 -m tierstore bench fire --dir /tmp/benchfire --device cuda \
  --drop-caches --out "$OUT/fire.json" --png "$OUT/fire.png" ${BENCH_ARGS:-} > "$OUT/bench_fire.log" 2> "$OUT/bench_fire.err"
echo "bench rc=$?"
cat "$OUT/bench_fire.log"; tail -5 "$OUT/bench_fire.err"
stamp done

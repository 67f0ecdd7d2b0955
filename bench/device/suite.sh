#!/usr/bin/env bash
# One device call: build sm_90, the GPU tests and the whole suite, then the MoE kernel and
# preheat benchmarks and the demo on the GPU pool. Logs and JSON land in $OUT.
#   bash bench/device/suite.sh [tests|bench|all]
what=${1:-all}
STAMP=suite
[ "$what" = bench ] && GPU_TESTS=none
source "$(dirname "$0")/prelude.sh"
if [[ $what == tests || $what == all ]]; then
  stamp "full suite"
  timeout ${SUITE_TIMEOUT:-170} python3 -m pytest -q -n 12 -p no:cacheprovider tests > "$OUT/all_tests.log" 2>&1
  echo "full suite rc=$?"; tail -8 "$OUT/all_tests.log"
fi
if [[ $what == bench || $what == all ]]; then
  stamp "moe kernel bench"
  timeout 90 python3 bench/bench_moe.py --json "$OUT/moe.json" 2>&1 | tail -20
  stamp "preheat bench"
  timeout 110 python3 bench/bench_warm.py --preheat --device cuda --pool-gb 6 --json 2>&1 | tee "$OUT/preheat.json" | tail -20
  stamp "demo"
  timeout 90 python3 -m tierstore demo --device cuda 2>&1 | tee "$OUT/demo.txt" | tail -22
fi
stamp done

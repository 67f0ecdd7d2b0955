#!/usr/bin/env bash
# A verification call on the GPU machine: build sm_90, every `gpu` test, vLLM-Moet's
# force_promote bench and the checksum-on-load cost (bench_verify). Logs and JSON land in $OUT.
# Usage (device tool, carry .whl):  bash bench/device/final.sh   (FULL_SUITE=1 adds the whole suite on 14 workers;
# the order puts the checks that matter most first, so a call cut at its limit keeps them;
# QUICK=1 stops after the moet promote bench)
STAMP=final; source "$(dirname "$0")/prelude.sh"   # wheels, machine, sm_90 build, gpu tests
stamp "moet promote (direct vs staged force_promote, same run)"
timeout ${PROMOTE_TIMEOUT:-300} python3 bench/bench_moet_promote.py --json "$OUT/moet_promote.json" > "$OUT/moet_promote.log" 2>&1
echo "moet rc=$?"; tail -42 "$OUT/moet_promote.log"
if [ "${QUICK:-0}" = 1 ]; then stamp "done (QUICK=1: build, gpu tests, moet promote)"; exit 0; fi
if [ "${FULL_SUITE:-0}" = 1 ]; then
  stamp "full suite"
  timeout ${SUITE_TIMEOUT:-200} python3 -m pytest -q -n 14 -p no:cacheprovider tests > "$OUT/full_suite.log" 2>&1
  echo "full suite rc=$?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/full_suite.log" | tail -25
fi
stamp "verify cost"
timeout 150 python3 bench/bench_verify.py --dir /tmp/bv --device cuda --repeats 15 --json "$OUT/verify.json" > "$OUT/verify.log" 2>&1
echo "verify rc=$?"; python3 -c "
import json; d=json.load(open('$OUT/verify.json'))
for m, v in d['modes'].items(): print(m, [(round(r['median_ms'],2), round(r['ratio_to_off'],3), r['verified_rows']) for r in v])" 2>&1 | tail -6
stamp "verify cost, 40 MiB rows"
timeout 150 python3 bench/bench_verify.py --dir /tmp/bv40 --device cuda --row-mib 40 --rows 16 --repeats 7 --json "$OUT/verify40.json" > "$OUT/verify40.log" 2>&1
echo "verify40 rc=$?"; tail -8 "$OUT/verify40.log"
stamp done

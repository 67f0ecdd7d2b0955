#!/usr/bin/env bash
# The end-of-round device call: build sm_90, every GPU test (`-m gpu tests`), then the
# checksums-on-load cost (verify="always", the default, against "off") at 12 and 40 MiB
# rows on the CUDA pool, bounded to LIMIT seconds in all. JSON and logs land in $OUT.
#   bash bench/device/round.sh            (carry .whl)
LIMIT=${LIMIT:-570}
STAMP=round TEST_TIMEOUT=${TEST_TIMEOUT:-300}
source "$(dirname "$0")/prelude.sh"
verify() {   # NAME ARGS...: one bench_verify run, bounded by what is left of LIMIT
  local name=$1; shift
  local left=$(( LIMIT - $(date +%s) + t0 ))
  [ "$left" -gt 20 ] || { echo "no time left for verify $name"; return; }
  stamp "bench verify $name (${left}s left)"
  timeout "$left" python3 bench/bench_verify.py --dir /tmp/tierstore-bench-verify --device cuda \
    --repeats 5 --json "$OUT/verify_$name.json" "$@" > "$OUT/verify_$name.log" 2>&1
  echo "rc=$?"; tail -6 "$OUT/verify_$name.log"
}
verify 12mib --rows 64 --row-mib 12
verify 40mib --rows 24 --row-mib 40
stamp done

#!/usr/bin/env bash
# One device call for the one-store round: build sm_90, every `gpu` test, vLLM-Moet's
# force_promote through the face against the store's fire on the same store, the store's
# bookkeeping (bench_store) and `tierstore bench fire` (the store-level fire figures).
# Usage (device tool, carry .whl: msgspec, hypothesis, sortedcontainers for py3.12):
#   bash bench/device/one_store.sh          (QUICK=1: build, gpu tests, moet promote only)
# Logs and JSON land in $OUT (default /tmp/out).
STAMP=one_store; source "$(dirname "$0")/prelude.sh"   # wheels, machine, sm_90 build, gpu tests
stamp "interrupt and face tests (Python 3.12 here)"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/store/test_store_interrupts.py \
  tests/adapters/test_adapter_moet_surface.py tests/adapters/test_adapter_moet_conformance.py \
  tests/adapters/test_adapter_moet_slots.py tests/store/test_fire_pipelined.py tests/io/test_integrity.py 2>&1 | tail -3
if [ -d .baseline/tierstore ]; then   # a `git archive` of the commit before (carry .baseline)
  ln -sf "$PWD"/tierstore/_C*.so .baseline/tierstore/
  stamp "fire + release, this tree against .baseline, same machine"
  taskset -c 1 python3 bench/fire_release_threads.py "$PWD/.baseline" "$PWD" 2>&1 | tail -2
fi
stamp "moet promote: force_promote vs the store's fire, same store"
timeout ${PROMOTE_TIMEOUT:-240} python3 bench/bench_moet_promote.py --json "$OUT/moet_promote.json" > "$OUT/moet_promote.log" 2>&1
echo "moet rc=$?"; tail -16 "$OUT/moet_promote.log"
if [ "${QUICK:-0}" = 1 ]; then stamp done; exit 0; fi
stamp "store bookkeeping"
timeout 200 python3 -m pytest bench/bench_store.py -q -p no:cacheprovider -o python_files='bench_*.py' \
  --benchmark-enable --benchmark-columns=min,median,max,rounds > "$OUT/bench_store.log" 2>&1
echo "bench_store rc=$?"; grep -E "^(test_|Name|-)" "$OUT/bench_store.log" | head -30
stamp "bench fire"
timeout ${FIRE_TIMEOUT:-240} python3 -m tierstore bench fire --dir /tmp/benchfire --device cuda \
  --out "$OUT/fire.json" > "$OUT/bench_fire.log" 2> "$OUT/bench_fire.err"
echo "bench fire rc=$?"; tail -30 "$OUT/bench_fire.log"; tail -3 "$OUT/bench_fire.err"
stamp done

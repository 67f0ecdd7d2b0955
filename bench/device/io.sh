#!/usr/bin/env bash
# One device call for the I/O engine: build sm_90, the engine tests, then `bench io` with
# the checked-in config (bench/configs/io_h200.json). Logs and JSON land in $OUT.
#   bash bench/device/io.sh [SWEEP]        (SWEEP: THREADS:CHUNK_MIB[:noramp],...)
SWEEP=${1:-16:4:noramp,16:2,16:8}
LIMIT=${LIMIT:-285}   # seconds for the whole script (the call's timeout_s is 300)
STAMP=io GPU_TESTS="tests/test_engine*.py" TEST_TIMEOUT=120
source "$(dirname "$0")/prelude.sh"
stamp "bench io"
# SIGINT on overrun: bench io then writes what it measured (JSON with "incomplete").
timeout -s INT $(( LIMIT - $(date +%s) + t0 )) python3 bench/bench_io.py \
  bench/configs/io_h200.json --pack /tmp/tierstore-bench-io.bin --sweep "$SWEEP" \
  --out "$OUT/io.json" 2>&1 | tee "$OUT/bench.log" | tail -45
stamp done

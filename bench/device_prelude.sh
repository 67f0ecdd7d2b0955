# Sourced by the device-call scripts (bench/device_one_store.sh, bench/final_h200.sh): the
# carried wheels, the machine's identity, the sm_90 build and every `gpu` test. Logs land in
# $OUT (default /tmp/out); `stamp MSG` prints the seconds since the start with ${STAMP}.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
t0=$(date +%s); stamp() { echo "[${STAMP:-device} +$(( $(date +%s) - t0 ))s] $*"; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > "$OUT/pip.log" 2>&1
export PYTHONPATH=/tmp/site:$PWD
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; uname -r; nproc;
  python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__)"; git log -1 --oneline 2>/dev/null; } > "$OUT/machine.txt"
cat "$OUT/machine.txt"
stamp build
cmake -S . -B build/dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE=$(which python3) \
  -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/build.log" 2>&1 && cmake --build build/dev -j16 >> "$OUT/build.log" 2>&1 \
  && cp build/dev/_C*.so tierstore/ || { echo "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1; }
python3 -c "import tierstore as t; print('cuda_available', t.cuda_available())" | tee -a "$OUT/machine.txt"
stamp "gpu tests"
timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_tests.log" | tail -25

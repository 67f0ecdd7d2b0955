# Sourced by every device-call script in bench/device/ (bash bench/device/<script>.sh from
# the repository root, or from anywhere: it changes to the root). It installs the carried
# wheels, records the machine, builds the extension for sm_90 in build/dev and runs the GPU
# tests. Logs land in $OUT (default /tmp/out); `stamp MSG` prints seconds since the start.
#   EXTRA_WHEELS  more wheel directories to install --no-deps (e.g. .whl-kvikio)
#   GPU_TESTS     pytest arguments of the test step (default: -m gpu tests; "none" skips it)
#   TEST_TIMEOUT  seconds for the test step (default 300)
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
t0=$(date +%s); stamp() { echo "[${STAMP:-device} +$(( $(date +%s) - t0 ))s] $*"; }
wheels=(.whl/*.whl)
for d in ${EXTRA_WHEELS:-}; do wheels+=("$d"/*.whl); done
python3 -m pip install -q --no-index --no-deps --target /tmp/site "${wheels[@]}" > "$OUT/pip.log" 2>&1 \
  || echo "pip install of the carried wheels failed (see $OUT/pip.log)"
export PYTHONPATH=/tmp/site:$PWD
{ nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current \
    --format=csv,noheader; uname -r; nproc; free -g | sed -n 2p;
  python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__)"; git log -1 --oneline 2>/dev/null; } > "$OUT/machine.txt"
cat "$OUT/machine.txt"
stamp build
cmake -S . -B build/dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE=$(which python3) \
  -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/build.log" 2>&1 && cmake --build build/dev -j16 >> "$OUT/build.log" 2>&1 \
  && cp build/dev/_C*.so tierstore/ || { echo "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1; }
python3 -c "import tierstore as t; print('cuda_available', t.cuda_available())" | tee -a "$OUT/machine.txt"
if [ "${GPU_TESTS:-}" != none ]; then
  stamp "gpu tests: ${GPU_TESTS:--m gpu tests}"
  # GPU_TESTS is word-split on purpose (several files, globs, -m gpu)
  timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider -rs ${GPU_TESTS:--m gpu tests} > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_tests.log" | tail -25
fi

"""vLLM-Moet's own FP4 tier and tierstore's drop-in, side by side, under vLLM-Moet's real code.

What it is
----------
At run time this script reads vLLM-Moet's patch (``patch/vllm-moet-v0.24.0.patch`` at HEAD
of a fetched vLLM-Moet repository), extracts the files the patch creates under
``vllm/model_executor/layers/quantization/utils/`` (``moe_w2_delta``, ``moe_w2_gate``,
``moe_w2_store``, and the three small modules those import: ``moe_w2_looka``,
``moe_w2_planes``, ``moe_w2_planes_cache``) into a temporary directory, and imports them
as real modules under a stand-in ``vllm`` package. No vLLM-Moet code is copied into this
repository. Then two arms run the same boot and the same steps (MOET-SURFACE.md section 2,
V1 runner unless a scenario says V2):

* ``moet``: vLLM-Moet's ``moe_w2_delta`` with its own ``DeltaTier`` and store;
* ``tierstore``: the same freshly imported vLLM-Moet modules after
  ``tierstore.adapters.vllm_moet.install(moe_w2_delta)``, so ``get_tier``,
  ``check_pool_floor`` and ``shutdown`` are tierstore's and ``moe_w2_delta._TIER`` is a
  ``TierstoreDeltaTier``; the gate (``moe_w2_gate``), ``mark_seen`` and the runner
  protocol stay vLLM-Moet's, as under the plugin.

Boot: ``get_tier(n_experts=E, dev=, w13_bytes=, w2_bytes=)`` -> ``add_layer_host_planes``
per layer -> V1: ``check_pool_floor(top_k, 0, 1)`` (a ValueError refuses the boot, other
errors are logged, as the V1 runner does) -> an eager profile forward -> ``finalize_auto``
(an error is a warning, as the worker does) -> ``notify_capture``. A step:
``wait_manager_idle`` -> forward (per layer the module-level ``mark_seen(tier.seen[layer],
ids)`` and a read of ``slot_table[layer]``) -> the real gate ``should_reforward`` on
seeded synthetic logits -> on a fire up to ``fire_fp_max()`` rounds of the real
``moe_w2_gate.force_promote_step(max_promote=remaining budget)`` + a replay forward
(its routing partly re-drawn, seeded, the same for both arms) -> ``step_end``;
``shutdown`` at the end. At every forward every mapped slot's bytes are compared with
the planes. Recorded per step and arm: the fire, the promotions per round, the routed
pairs served at FP4 (mapped in ``slot_table`` at the forward; the final forward is the
replay), pairs served at FP4 by a fired step's forward whose slot is gone at its replay
("lost": unmapped, or evicted and promoted again into another slot), slots holding
wrong bytes, and the lazy (manager) promotions with the mapping changes they made.

Runs: a seeded Zipf-like router with drifting hot experts (6 layers x 32 experts,
top-4, 3 KiB slots, a 48-slot pool), and with ``--trace`` a real routing trace (the
FLAME-MoE one: 8 layers x 64 experts, top-6, its own geometry, a 96-slot pool). The comparison gives
totals, per-step equality and, for every event (a lazy pass, a fire round) that
started from the same state in both arms (mapped set and the policy's scores) but
ended differently, whether the two picks have the same multiset of policy scores (a
tie broken another way) or not. Four known divergences run as separate scenarios: (1)
packs left unfinished by one engine and resumed by the other, (2) pairs losing their
slot between a fired step's forward and its replay under DELTA_PROMOTE=32 and a pool
at the fire floor, in the CPU's event order and in a modelled GPU event order, (3)
DELTA_GB=auto with the gate armed and free memory under the fire floor or 0 slots,
(4) ``tierstore.adapters.vllm_moet.register()`` with the plugin off and malformed
VLLM_MOE_W2_* values.

How to run
----------
    python3 bench/moet_side_by_side.py --moet-repo /path/to/vLLM-Moet --trace flame.npy \
        --json bench/results/moet_side_by_side.json
    python3 bench/moet_side_by_side.py --moet-repo /path/to/vLLM-Moet --steps 200 --seed 0
    python3 bench/moet_side_by_side.py --moet-repo /path/to/vLLM-Moet \
        --tierstore-commit 3f34b4e --tierstore-commit HEAD --json out.json

Without ``--tierstore-commit`` the installed tierstore runs. ``--tierstore-commit REV``
runs tierstore as of REV of this repository (``git archive`` into the temp dir with the
installed ``_C`` linked in; refused when ``csrc`` differs from HEAD); given several
times, each runs in a child process and the JSON holds ``{"meta", "by_tierstore":
{REV: report}}``. A table goes to stdout, progress to stderr, ``--json OUT`` writes
everything (atomic). About 15 s per tierstore on 2 CPU cores. A missing repository or
patch is a one-line error.

Stand-ins (everything else is vLLM-Moet's code exactly as its patch creates it)
-------------------------------------------------------------------------------
* ``vllm`` package tree: empty ``__init__`` files for ``vllm``, ``vllm.model_executor``,
  ``...layers``, ``...quantization``, ``...quantization.utils``.
* ``vllm.logger.init_logger(name)``: a stdlib logger plus ``warning_once`` /
  ``info_once`` / ``debug_once``.
* ``vllm.config.get_current_vllm_config()``: an object whose ``parallel_config`` has no
  ubatching (``check_pool_floor`` reads it); anything else it is asked raises
  AttributeError, which both engines catch.
* ``vllm.distributed`` is absent: both engines then name packs ``rank0of1``.
* ``moe_w2_cubit`` (vLLM-Moet's fused-MoE glue: Triton kernels, CUDA cubins, a vLLM
  custom op; it cannot be imported on a CPU): a module with the four names
  ``moe_w2_delta`` reads from it, ``_PREFILL_T``, ``_EXL3_BASE``, ``enabled()`` and
  ``_layer_cutoff()``, from the same variables with the same defaults. The glue itself
  is replaced by this script's forward (``mark_seen`` + ``slot_table`` reads).
* CUDA: their modules' global name ``torch`` is rebound to a proxy of the real torch
  whose ``cuda`` attribute is a CPU stand-in (torch and tierstore stay untouched):
  ``Stream`` (``wait_stream``/``synchronize`` do nothing: one CPU "stream"),
  ``stream(s)`` (a null context), ``current_stream``, ``current_device`` (0),
  ``set_device`` (no-op; the manager thread calls it every pass), ``synchronize``,
  ``Event`` (``record``/``query``/``synchronize``; complete at once, or in the modelled
  GPU order below), ``mem_get_info`` (the scenario's free bytes, for ``finalize_auto``),
  ``is_available`` (False: their pack store then stages in pageable memory),
  ``is_current_stream_capturing`` (False); the proxy's tensor factories (``empty``,
  ``zeros``, ``zeros_like``, ...) drop ``pin_memory=True`` (pinning needs a CUDA
  driver). Without the proxy ``DeltaTier.__init__`` fails at its first pinned buffer.
* ``dev``: ``torch.device("cpu", 0)`` for vLLM-Moet's arm (``DeltaTier.__init__``
  replaces an index-less ``torch.device`` by ``cuda:<current_device()>``, D:228-230),
  ``torch.device("cpu")`` for tierstore's (on a GPU both would get ``cuda:0``).
* tierstore's ``finalize_auto`` is given ``free_bytes=`` (on a CPU device it would read
  the host's free memory); vLLM-Moet's reads the ``mem_get_info`` stand-in: both see the
  same number.
* Modelled GPU event order (scenario 2 "gpu" only): an event recorded while the runner
  is in step N completes when the runner reaches step N+1's ``wait_manager_idle`` (or
  when an event recorded after it is synchronized); the forward sleeps ``--gpu-forward-ms``
  after reading ``slot_table``, as a GPU forward takes time while host threads run. On
  a CPU device a tierstore tier with a manager snapshot hand-off (``_fold_seen``,
  ``_snapshot_event``: tierstore before its one-store refactor) records no event, so
  the same stand-in event is attached to that snapshot by wrapping the tier instance's
  ``_fold_seen`` (no tierstore file changes); a tier without that hand-off is run
  as is (``tierstore_gpu_order_modelled: false``). vLLM-Moet's arm is timing-dependent
  there (its manager thread retries every ~0.5-5 ms and may run during the forward).
* Settings held fixed for determinism (both arms): ``VLLM_MOE_W2_DELTA_DECAY_S=1e9``
  (the freq/need decay is wall-clock based and would fire at different steps in the two
  runs), ``VLLM_MOE_W2_CKPT_ID`` set (pack identity without a vLLM config),
  ``VLLM_MOE_W2_NUM_LAYERS=L-1`` (slot-table rows = L), ``STORE_THREADS=2``.

What cannot run on a CPU: ``moe_w2_cubit`` (kernels, custom op) and CUDA-graph capture
(``notify_capture`` is called once, outside any capture). Everything the tier, the gate
and the store do runs as written.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import importlib
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
import types
from dataclasses import dataclass

import numpy as np
import torch

PATCH = "patch/vllm-moet-v0.24.0.patch"
UTILS = "vllm/model_executor/layers/quantization/utils/"
PKG = UTILS.replace("/", ".")
THEIRS = (
    "moe_w2_planes",
    "moe_w2_planes_cache",
    "moe_w2_looka",
    "moe_w2_store",
    "moe_w2_gate",
    "moe_w2_delta",
)
P = "VLLM_MOE_W2_"
# the glue's ``dev``: cpu:0 for vLLM-Moet (its DeltaTier maps an index-less device to cuda:N)
DEV = {"moet": torch.device("cpu", 0), "tierstore": torch.device("cpu")}
KINDS = ("moet", "tierstore")
LABEL = {"moet": "vLLM-Moet", "tierstore": "tierstore"}


class Fatal(Exception):
    """A setup problem reported as one line, without a traceback."""


def progress(msg: str) -> None:
    print(f"[moet-side-by-side] {msg}", file=sys.stderr, flush=True)


def one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:400]


# == 1. vLLM-Moet's files, from the patch =================================================
def read_patch(repo: str) -> tuple[str, str]:
    """The patch text and the repository's HEAD commit (a bare mirror or a checkout)."""
    if not os.path.isdir(repo):
        raise Fatal(
            f"vLLM-Moet repository not found at {repo} (fetch kacper-daftcode/vLLM-Moet or pass --moet-repo)"
        )
    git = ["git", "-C", repo]
    head = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    commit = head.stdout.strip() if head.returncode == 0 else "unknown"
    plain = os.path.join(repo, PATCH)
    if os.path.isfile(plain):
        with open(plain, encoding="utf-8") as f:
            return f.read(), commit
    shown = subprocess.run(git + ["show", f"HEAD:{PATCH}"], capture_output=True, text=True, check=False)
    if shown.returncode != 0 or not shown.stdout:
        why = (shown.stderr.strip().splitlines() or ["empty"])[0]
        raise Fatal(f"{repo}: no {PATCH} at HEAD ({why})")
    return shown.stdout, commit


def new_files(patch: str, wanted: list[str]) -> dict[str, str]:
    """Files the patch creates (``--- /dev/null`` + ``+++ b/<path>``): the '+' lines of
    their hunks, each hunk checked against its header's line count."""
    lines, out, i = patch.split("\n"), {}, 0
    while i < len(lines):
        if lines[i] == "--- /dev/null" and lines[i + 1 : i + 2] and lines[i + 1].startswith("+++ b/"):
            path = lines[i + 1][len("+++ b/") :]
            body, i = _hunks(lines, i + 2, path)
            if path in wanted:
                out[path] = body
            continue
        i += 1
    missing = [w for w in wanted if w not in out]
    if missing:
        raise Fatal(f"{PATCH} creates none of {missing}")
    return out


def _hunks(lines: list[str], i: int, path: str) -> tuple[str, int]:
    body = []
    while i < len(lines) and lines[i].startswith("@@"):
        m = re.match(r"@@ -0,0 \+1(?:,(\d+))? @@", lines[i])
        if not m:
            raise Fatal(f"{PATCH}: {path}: unexpected hunk header {lines[i]!r}")
        want, i = int(m.group(1) or 1), i + 1
        got = 0
        while got < want and i < len(lines):
            line, i = lines[i], i + 1
            if line.startswith("\\"):  # "\ No newline at end of file"
                continue
            if not line.startswith("+"):
                raise Fatal(f"{PATCH}: {path}: a new file's hunk has {line[:40]!r}")
            body.append(line[1:])
            got += 1
        if got != want:
            raise Fatal(f"{PATCH}: {path}: hunk ends after {got} of {want} lines")
        while i < len(lines) and lines[i].startswith("\\"):
            i += 1
    return "\n".join(body) + "\n", i


STANDIN_LOGGER = '''"""Stand-in for vllm.logger (moet_side_by_side.py)."""
import logging


def init_logger(name):
    log = logging.getLogger(name)
    seen = set()

    def once(level):
        def emit(msg, *args, **kwargs):
            if (level, msg) not in seen:
                seen.add((level, msg))
                log.log(level, msg, *args)
        return emit
    log.warning_once, log.info_once, log.debug_once = (
        once(logging.WARNING), once(logging.INFO), once(logging.DEBUG))
    return log
'''

STANDIN_CONFIG = '''"""Stand-in for vllm.config (moet_side_by_side.py): no ubatching."""
import types

_CONFIG = types.SimpleNamespace(
    parallel_config=types.SimpleNamespace(use_ubatching=False, ubatch_size=0))


def get_current_vllm_config():
    return _CONFIG
'''

STANDIN_CUBIT = '''"""Stand-in for vLLM-Moet's moe_w2_cubit (moet_side_by_side.py): the four names
moe_w2_delta reads, from the same variables and defaults (C:134, C:197, C:372-400)."""
import os

_PREFILL_T = int(os.getenv("VLLM_MOE_W2_PREFILL_T", "96"))
_EXL3_BASE = os.getenv("VLLM_MOE_W2_EXL3_BASE", "0") == "1"


def enabled():
    return os.getenv("VLLM_MOE_W2", "0") == "1"


def _layer_cutoff():
    v = os.getenv("VLLM_MOE_W2_NUM_LAYERS")
    return int(v) if v is not None else 43
'''


def build_tree(root: str, files: dict[str, str]) -> None:
    """The stand-in ``vllm`` package with vLLM-Moet's real modules in it."""
    for pkg in (
        "vllm",
        "vllm/model_executor",
        "vllm/model_executor/layers",
        "vllm/model_executor/layers/quantization",
        UTILS.rstrip("/"),
    ):
        os.makedirs(os.path.join(root, pkg), exist_ok=True)
        open(os.path.join(root, pkg, "__init__.py"), "w").close()
    standins = {
        "vllm/logger.py": STANDIN_LOGGER,
        "vllm/config.py": STANDIN_CONFIG,
        UTILS + "moe_w2_cubit.py": STANDIN_CUBIT,
    }
    for rel, text in {**standins, **files}.items():
        with open(os.path.join(root, rel), "w", encoding="utf-8") as f:
            f.write(text)


# == 2. CUDA, stood in on the CPU (their modules only) =====================================
class GpuClock:
    """When stand-in events complete: at once (``lag`` off: a CPU has nothing queued), or
    (``lag`` on) when the runner reaches the next step's wait_manager_idle, or when an
    event recorded after them is synchronized (a GPU drains a stream in order)."""

    def __init__(self):
        self.lag, self.boundary, self.seq, self.drained = False, 0, 0, 0

    def stamp(self) -> tuple[int, int]:
        self.seq += 1
        return self.seq, (self.boundary + 1 if self.lag else 0)

    def done(self, seq: int, at: int) -> bool:
        return self.boundary >= at or seq <= self.drained

    def reset(self, lag: bool) -> None:
        self.__init__()
        self.lag = lag


CLOCK = GpuClock()
CALLS: collections.Counter = collections.Counter()  # stand-in calls, per name


class StandInEvent:
    def __init__(self, *args, **kwargs):
        CALLS["Event"] += 1
        self.seq, self.at = 0, 0

    def record(self, stream=None):
        self.seq, self.at = CLOCK.stamp()

    def query(self) -> bool:
        CALLS["Event.query"] += 1
        return CLOCK.done(self.seq, self.at)

    def synchronize(self) -> None:
        CALLS["Event.synchronize"] += 1
        CLOCK.drained = max(CLOCK.drained, self.seq)

    def wait(self, stream=None) -> None:
        pass


class StandInStream:
    def __init__(self, device=None, *args, **kwargs):
        CALLS["Stream"] += 1
        self.device = device

    def wait_stream(self, other) -> None:
        CALLS["Stream.wait_stream"] += 1

    def wait_event(self, event) -> None:
        pass

    def synchronize(self) -> None:
        CALLS["Stream.synchronize"] += 1
        CLOCK.drained = CLOCK.seq

    def query(self) -> bool:
        return True


class CpuCuda:
    """``torch.cuda`` as vLLM-Moet's modules see it here (module doc: Stand-ins)."""

    Stream, Event = StandInStream, StandInEvent

    def __init__(self):
        self.free_bytes, self.total_bytes = 0, 0
        self._main = StandInStream("main")

    def stream(self, s=None):
        CALLS["stream"] += 1
        return contextlib.nullcontext(s)

    def current_stream(self, device=None):
        CALLS["current_stream"] += 1
        return self._main

    def current_device(self) -> int:
        CALLS["current_device"] += 1
        return 0

    def set_device(self, device) -> None:
        CALLS["set_device"] += 1

    def synchronize(self, device=None) -> None:
        CALLS["synchronize"] += 1
        CLOCK.drained = CLOCK.seq

    def mem_get_info(self, device=None) -> tuple[int, int]:
        CALLS["mem_get_info"] += 1
        return int(self.free_bytes), int(self.total_bytes)

    def is_available(self) -> bool:
        return False

    def is_current_stream_capturing(self) -> bool:
        return False


class TorchProxy(types.ModuleType):
    """``torch`` for vLLM-Moet's modules: the real one, but ``cuda`` is the CPU stand-in and
    the tensor factories drop ``pin_memory=True``."""

    def __init__(self, cuda: CpuCuda):
        super().__init__("torch")
        self.cuda = cuda
        for name in ("empty", "zeros", "zeros_like", "empty_like", "full", "ones"):
            setattr(self, name, _unpinned(getattr(torch, name)))

    def __getattr__(self, name):
        return getattr(torch, name)


def _unpinned(factory):
    def make(*args, **kwargs):
        if kwargs.pop("pin_memory", False):
            CALLS["pin_memory"] += 1
        return factory(*args, **kwargs)

    return make


# every stand-in, for the report (the module doc explains each)
STAND_INS = [
    "vllm package tree: empty __init__ for vllm, model_executor, layers, quantization, utils",
    "vllm.logger.init_logger: stdlib logger + warning_once/info_once/debug_once",
    "vllm.config.get_current_vllm_config: parallel_config without ubatching only",
    "vllm.distributed: absent (packs are named rank0of1, as both engines fall back to)",
    (
        "moe_w2_cubit: _PREFILL_T, _EXL3_BASE, enabled(), _layer_cutoff() from the same env vars; "
        "the real glue (Triton, CUDA cubins, custom op) cannot import on a CPU"
    ),
    (
        "torch.cuda for their modules (a proxy of torch bound to their global name): Stream, "
        "stream(), current_stream, current_device, set_device, synchronize, Event, mem_get_info, "
        "is_available (False), is_current_stream_capturing (False)"
    ),
    "pin_memory=True dropped by their modules' tensor factories (no CUDA driver)",
    (
        "dev=torch.device('cpu', 0) for vLLM-Moet (DeltaTier maps an index-less device to "
        "cuda:current_device()), torch.device('cpu') for tierstore"
    ),
    "tierstore finalize_auto(free_bytes=) and vLLM-Moet's mem_get_info get the same free bytes",
    (
        "scenario 2 'gpu' order: stand-in events complete at the next step's wait_manager_idle; "
        "a tierstore tier with a snapshot hand-off (before the one-store refactor) gets one for "
        "its CPU step_end snapshot via a per-instance _fold_seen wrapper; the forward sleeps "
        "--gpu-forward-ms"
    ),
    (
        "VLLM_MOE_W2_DELTA_DECAY_S=1e9 (wall-clock decay off), CKPT_ID, NUM_LAYERS=L-1, "
        "STORE_THREADS=2 for both arms"
    ),
]


# == 3. loading both arms ==================================================================
class WarningCount(logging.Handler):
    """Counts WARNING+ records of vLLM-Moet's and tierstore's loggers, per run."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.reset()

    def emit(self, record):
        side = "tierstore" if record.name.startswith("tierstore") else "moet"
        self.counts[side] += 1
        msg = " ".join(record.getMessage().split())[:200]
        if msg not in self.first[side] and len(self.first[side]) < 3:
            self.first[side].append(msg)

    def reset(self) -> None:
        self.counts, self.first = collections.Counter(), {k: [] for k in KINDS}

    def of(self, side: str) -> dict:
        return {"count": self.counts[side], "first": list(self.first[side])}


def set_env(environ: dict) -> None:
    for k in [k for k in os.environ if k.startswith(P)]:
        del os.environ[k]
    os.environ.update(environ)


def load_moet(ctx, environ: dict) -> types.SimpleNamespace:
    """vLLM-Moet's modules, imported afresh under ``environ`` (they read it at import)."""
    set_env(environ)
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        del sys.modules[name]
    if ctx.tree not in sys.path:
        sys.path.insert(0, ctx.tree)
    importlib.invalidate_caches()
    mods = {n: importlib.import_module(PKG + n) for n in THEIRS}
    for m in mods.values():
        m.torch = ctx.proxy
    return types.SimpleNamespace(**{n[len("moe_w2_") :]: m for n, m in mods.items()})


@contextlib.contextmanager
def open_arm(ctx, kind: str, environ: dict, geo, planes, gpu_forward_s: float = 0.0):
    """One arm over fresh vLLM-Moet modules; teardown calls the module's ``shutdown``."""
    from tierstore.adapters import vllm_moet as vm

    mods = load_moet(ctx, environ)
    if kind == "tierstore":
        vm.reset_env()
        vm.install(mods.delta)
    arm = Arm(kind, mods, geo, planes, ctx.cuda, gpu_forward_s)
    try:
        yield arm
    finally:
        for module in (mods.delta, mods.gate):  # the worker's teardown order
            try:
                module.shutdown()
            except Exception as exc:  # noqa: BLE001 - reported, the next arm must still start
                arm.errors.append(f"{module.__name__.rsplit('.', 1)[-1]}.shutdown: {one_line(exc)}")
        if kind == "tierstore":
            vm.uninstall()
            if vm._TIER is not None:  # a failed shutdown: forget the tier (harness cleanup)
                vm._TIER = None
            vm.reset_env()


# == 4. the engine side: boot, forward, gate, step_end ========================================
@dataclass
class Geometry:
    name: str
    layers: int
    experts: int
    top_k: int
    slots: int
    w13: int = 2048
    w2: int = 1024

    @property
    def slot_bytes(self) -> int:
        return self.w13 + self.w2

    @property
    def fire_floor(self) -> int:  # V1, no spec, 1 seq, GATE_FP_MAX 3
        return int(self.layers * self.top_k * 1.0 * 1 * 1.7)

    def env(self, **extra) -> dict:
        e = {
            P + "NUM_LAYERS": str(self.layers - 1),
            P + "CKPT_ID": "moet-side-by-side",
            P + "GATE": "1",
            P + "STORE_THREADS": "2",
            P + "DELTA_DECAY_S": "1e9",
            P + "DELTA_GB": repr(self.slots * self.slot_bytes / 2**30),
        }
        e.update({P + k: str(v) for k, v in extra.items()})
        return e


def make_planes(geo: Geometry, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        k: (
            torch.randint(0, 256, (geo.experts, geo.w13), dtype=torch.uint8, generator=g),
            torch.randint(0, 256, (geo.experts, geo.w2), dtype=torch.uint8, generator=g),
        )
        for k in range(geo.layers)
    }


def digest(*arrays) -> str:
    h = hashlib.sha1()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


class Arm:
    """Drives one ``moe_w2_delta`` module as vLLM-Moet's glue, gate, V1/V2 runner and worker."""

    def __init__(self, kind, mods, geo: Geometry, planes: dict, cuda: CpuCuda, gpu_forward_s):
        self.kind, self.m, self.geo, self.cuda = kind, mods, geo, cuda
        self.planes, self.gpu_forward_s = planes, gpu_forward_s
        self.flat = torch.cat([torch.cat(planes[k], 1) for k in range(geo.layers)])
        self.policy = os.environ.get(P + "DELTA_POLICY", "freq")
        self.errors: list[str] = []
        self.events: list[dict] = []
        self.last_mapped = set()
        self.at_step_end = None  # (mapped, scores) just before the last step_end

    @property
    def tier(self):
        return self.m.delta._TIER

    # -- boot ---------------------------------------------------------------------------------
    def boot(
        self,
        profile_route,
        runner: str = "v1",
        free_bytes: int | None = None,
        n_stage: int | None = None,
        info: dict | None = None,
    ) -> dict:
        """Boot as the glue, the V1 (or V2) runner and the worker do; fills and returns
        ``info`` (given: still filled in part when a call raises). ``n_stage``: stop after
        staging that many layers (a boot that dies while writing its pack)."""
        d, g = self.m.delta, self.geo
        info = {} if info is None else info
        tier = d.get_tier(n_experts=g.experts, dev=DEV[self.kind], w13_bytes=g.w13, w2_bytes=g.w2)
        info["tier"] = type(tier).__name__ if tier is not None else None
        if tier is None:
            return info
        info["layers_in_store_before_staging"] = len(tier._store)
        for key in range(g.layers if n_stage is None else n_stage):
            tier.add_layer_host_planes(key, *self.planes[key])
        if n_stage is not None:
            return info
        if runner == "v1":
            try:
                d.check_pool_floor(g.top_k, 0, 1)
            except ValueError as exc:  # the V1 runner re-raises: boot fails
                info["refused"] = one_line(exc)
                return info
            except Exception as exc:  # noqa: BLE001 - the V1 runner only logs these
                info["floor_check_logged"] = one_line(exc)
        self.forward(profile_route, {})  # determine_available_memory: eager profile run
        self.finalize(tier, free_bytes, info)
        tier.notify_capture()  # the glue's call while capturing (no capture here)
        info.update(
            n_slots=int(tier.n_slots),
            pool_rows=int(tier.pool.shape[0]),
            layers_in_store=len(tier._store),
            sub_floor=getattr(tier, "_sub_floor", None),
        )
        return info

    def finalize(self, tier, free_bytes, info: dict) -> None:
        """The worker's ``_TIER.finalize_auto()`` after KV allocation; errors only warn."""
        try:
            if self.kind == "tierstore":
                tier.finalize_auto(free_bytes=free_bytes)
            else:
                self.cuda.free_bytes = free_bytes or 0
                self.cuda.total_bytes = 1 << 40
                tier.finalize_auto()
        except Exception as exc:  # noqa: BLE001 - vLLM-Moet's worker logs a warning
            info["finalize_auto_warning"] = one_line(exc)

    def lag_snapshots(self) -> bool:
        """Modelled GPU order for tierstore (module doc): its CPU ``step_end`` records no
        event, so give that snapshot the stand-in event a GPU's would complete late. False
        when the tier has no such hand-off (nothing to model)."""
        tier = self.tier
        fold = getattr(tier, "_fold_seen", None)
        if fold is None or not hasattr(tier, "_snapshot_event"):
            return False

        def fold_with_event():
            pending = tier._snapshot_pending
            fold()
            if tier._snapshot_pending and not pending:
                ev = StandInEvent()
                ev.record()
                tier._snapshot_event = ev

        tier._fold_seen = fold_with_event
        return True

    # -- reading the tier ---------------------------------------------------------------------
    def mapped(self) -> set:
        table = self.tier.slot_table.reshape(-1).numpy()
        return set(np.flatnonzero(table >= 0).tolist())

    def scores(self) -> np.ndarray:
        """The policy's score per key (``_freq``, or ``_need`` under ``need``), rounded to
        1e-6 so that float noise is not a difference; zeros where the tier has none."""
        t = self.tier
        s = getattr(t, "_need" if self.policy == "need" else "_freq", None)
        if s is None:
            return np.zeros(self.geo.layers * self.geo.experts)
        return np.round(np.asarray(s, np.float64).reshape(-1), 6)

    def wrong_keys(self) -> set:
        """Mapped keys whose slot does not hold their row (or a slot mapped twice / past the
        pool): a bug in the tier under test."""
        t = self.tier
        table = t.slot_table.reshape(-1).numpy().copy()
        keys = np.flatnonzero(table >= 0)
        if not len(keys):
            return set()
        slots = table[keys].astype(np.int64)
        n = int(t.pool.shape[0])
        bad = slots >= n
        uniq, counts = np.unique(slots, return_counts=True)
        dup = np.isin(slots, uniq[counts > 1])
        if n:
            rows = t.pool[torch.from_numpy(np.minimum(slots, n - 1))]
            bad |= (rows != self.flat[torch.from_numpy(keys)]).any(1).numpy()
        return set(keys[bad | dup].tolist())

    # -- one forward, as the glue runs it per MoE layer -------------------------------------
    def forward(self, route: np.ndarray, rec: dict) -> dict:
        """Returns {key: slot} of the routed pairs served at FP4."""
        d, tier, E = self.m.delta, self.tier, self.geo.experts
        served = {}
        for layer in range(self.geo.layers):
            ids = torch.from_numpy(route[layer]).long()
            if self.cuda.is_current_stream_capturing():
                tier.notify_capture()
            d.mark_seen(tier.seen[layer], ids.view(-1))
            slots = tier.slot_table[layer].index_select(0, ids).numpy()  # even with 0 slots
            served.update((layer * E + int(e), int(sl)) for e, sl in zip(route[layer], slots) if sl >= 0)
        self.last_mapped = self.mapped()
        if self.gpu_forward_s:
            time.sleep(self.gpu_forward_s)  # the kernels' time
        wrong = self.wrong_keys()
        rec["wrong"] = max(rec.get("wrong", 0), len(wrong))
        rec["wrong_served"] = rec.get("wrong_served", 0) + len(wrong & served.keys())
        return served

    def event(self, label: str, before: set, state: np.ndarray, key: np.ndarray) -> None:
        """What a lazy pass or a fire round changed, with the policy's scores (``state``:
        before it, ``key``: what it ranked by)."""
        after = self.mapped()
        ins, outs = sorted(after - before), sorted(before - after)
        self.events.append(
            {
                "label": label,
                "state": digest(sorted(before), state),
                "ins": ins,
                "outs": outs,
                "in_scores": sorted(key[ins].tolist()),
                "out_scores": sorted(key[outs].tolist()),
            }
        )

    # -- one step of the V1 runner ------------------------------------------------------------
    def step(self, s: int, routes: np.ndarray, logits: torch.Tensor) -> dict:
        d, g = self.m.delta, self.m.gate
        rec = {
            "step": s,
            "fired": False,
            "promoted": [],
            "served": [],
            "lost": 0,
            "lost_unmapped": 0,
            "lost_rerouted": 0,
            "wrong": 0,
            "wrong_served": 0,
            "errors": [],
        }
        self.events = []
        CLOCK.boundary += 1
        # lazy promotions land between the last step_end and this forward (published by
        # step_end, by the manager thread, or at wait_manager_idle, by design)
        before, state = self.at_step_end or (self.mapped(), self.scores())
        for t in (d._BASE_TIER, d._TIER):
            if t is not None:
                t.wait_manager_idle()
        self.event("lazy", before, state, self.scores())
        served = self.forward(routes[0], rec)
        rec["served"].append(len(served))
        rec["fired"] = bool(g.enabled() and g.should_reforward(logits.view(1, -1)))
        if rec["fired"]:
            self.fire(routes, served, rec)
        rec["mapped_digest"] = digest(sorted(self.last_mapped))
        self.at_step_end = (self.mapped(), self.scores())
        for t in (d._BASE_TIER, d._TIER):
            if t is not None:
                try:
                    t.step_end()
                except Exception as exc:  # noqa: BLE001 - the runners swallow it
                    rec["errors"].append(f"step_end: {one_line(exc)}")
        rec["events"] = self.events
        return rec

    def fire(self, routes: np.ndarray, served: dict, rec: dict) -> None:
        """The runner's fire loop: rounds of force_promote_step(max_promote=budget) + replay."""
        g, E = self.m.gate, self.geo.experts
        budget = g.step_promote_budget()
        for r in range(g.fire_fp_max()):
            before, state = self.mapped(), self.scores()
            try:
                n = int(g.force_promote_step(max_promote=budget))
            except Exception as exc:  # noqa: BLE001 - the runner logs and skips the replay
                rec["errors"].append(f"force_promote: {one_line(exc)}")
                return
            self.event(f"fire{r}", before, state, state)
            rec["promoted"].append(n)
            if budget is not None:
                budget -= n
            if n <= 0 or not g.reforward_enabled():
                return
            # served at FP4 by the last forward, but no longer in that slot at the replay
            # (unmapped, or evicted and promoted again into another slot)
            table = self.tier.slot_table.reshape(-1).numpy()
            moved = {k for k, slot in served.items() if int(table[k]) != slot}
            replay = {layer * E + int(e) for layer, row in enumerate(routes[r + 1]) for e in row}
            rec["lost"] += len(moved)
            rec["lost_unmapped"] += sum(int(table[k]) < 0 for k in moved)
            rec["lost_rerouted"] += len(moved & replay)
            served = self.forward(routes[r + 1], rec)
            rec["served"].append(len(served))


# == 5. routing and gate inputs =========================================================
def _draw(rng, p: np.ndarray, k: int) -> np.ndarray:
    return np.stack([rng.choice(p.shape[1], k, replace=False, p=row) for row in p])


def _reroute(prev: np.ndarray, p: np.ndarray, rng, frac: float) -> np.ndarray:
    """A replay's routing: each routed expert re-drawn with probability ``frac`` (the FP4
    experts change the hidden states, so later routers pick partly other experts)."""
    out = prev.copy()
    for layer in range(out.shape[0]):
        for j in range(out.shape[1]):
            if rng.random() < frac:
                free = np.setdiff1d(np.arange(p.shape[1]), out[layer])
                q = p[layer, free] / p[layer, free].sum()
                out[layer, j] = rng.choice(free, p=q)
    return out


def zipf_router(
    geo: Geometry,
    steps: int,
    rounds: int,
    seed: int,
    drift_every: int = 20,
    exponent: float = 1.1,
    reroute: float = 0.25,
):
    """Per layer a Zipf-like popularity over a seeded permutation of the experts; every
    ``drift_every`` steps one hot expert per layer swaps rank with a cold one."""
    rng = np.random.default_rng([seed, 1])
    L, E, k = geo.layers, geo.experts, geo.top_k
    perms = np.stack([rng.permutation(E) for _ in range(L)])
    base = 1.0 / np.arange(1, E + 1) ** exponent
    base /= base.sum()

    def probs():
        p = np.empty((L, E))
        for layer in range(L):
            p[layer, perms[layer]] = base
        return p

    p = probs()
    profile = _draw(rng, p, k)
    routes = np.empty((steps, rounds + 1, L, k), np.int64)
    for s in range(steps):
        if s and s % drift_every == 0:
            for layer in range(L):
                i, j = rng.integers(0, 6), rng.integers(E // 2, E)
                perms[layer, [i, j]] = perms[layer, [j, i]]
            p = probs()
        routes[s, 0] = _draw(rng, p, k)
        for r in range(1, rounds + 1):
            routes[s, r] = _reroute(routes[s, r - 1], p, rng, reroute)
    return routes, profile


def trace_router(path: str, steps: int, rounds: int, seed: int, slots: int, reroute: float = 0.25):
    """The trace's ticks as decode steps (tick 0 = the profile forward), in its own
    geometry (layers renumbered from 0); replays re-draw from each layer's popularity."""
    a = np.load(path)
    layers = np.unique(a[:, 1])
    E, ticks = int(a[:, 2].max()) + 1, len(np.unique(a[:, 0]))
    k = len(a) // (ticks * len(layers))
    if k * ticks * len(layers) != len(a) or steps + 1 > ticks:
        raise Fatal(
            f"{path}: expected [tick, layer, expert] rows, the same top-k for every "
            f"tick and layer, and more than {steps} ticks"
        )
    per = a[:, 2].reshape(ticks, len(layers), k).astype(np.int64)
    if not np.array_equal(
        a[:, 1].reshape(ticks, len(layers), k)[:, :, 0], np.broadcast_to(layers, (ticks, len(layers)))
    ):
        raise Fatal(f"{path}: rows are not sorted by tick, then layer")
    p = np.stack([np.bincount(per[:, i].ravel(), minlength=E) + 1.0 for i in range(len(layers))])
    p /= p.sum(1, keepdims=True)
    rng = np.random.default_rng([seed, 2])
    routes = np.empty((steps, rounds + 1, len(layers), k), np.int64)
    for s in range(steps):
        routes[s, 0] = per[s + 1]
        for r in range(1, rounds + 1):
            routes[s, r] = _reroute(routes[s, r - 1], p, rng, reroute)
    geo = Geometry("trace", len(layers), E, k, slots)
    return geo, routes, per[0]


def gate_logits(steps: int, seed: int, fire_rate: float, vocab: int = 64) -> torch.Tensor:
    """Per step one row of logits: flat (top-1 prob ~0.05, the gate fires) with
    probability ``fire_rate``, else one token 10 nats ahead (it does not)."""
    rng = np.random.default_rng([seed, 3])
    rows = []
    for _ in range(steps):
        if rng.random() < fire_rate:
            x = rng.normal(0.0, 0.5, vocab)
        else:
            x = rng.normal(0.0, 1.0, vocab)
            x[rng.integers(vocab)] += 10.0
        rows.append(x)
    return torch.tensor(np.stack(rows), dtype=torch.float32)


# == 6. serving runs and their comparison ====================================================
def serve(
    ctx,
    kind: str,
    geo: Geometry,
    environ: dict,
    planes,
    routes,
    profile,
    logits,
    steps: int,
    runner: str = "v1",
    free_bytes=None,
    lag: bool = False,
    gpu_ms: float = 0.0,
) -> dict:
    CLOCK.reset(lag)
    CALLS.clear()
    ctx.warnings.reset()
    hist, t0 = [], time.perf_counter()
    with open_arm(ctx, kind, environ, geo, planes, gpu_ms / 1e3) as arm:
        boot = arm.boot(profile, runner=runner, free_bytes=free_bytes)
        if lag and kind == "tierstore" and arm.tier is not None:
            boot["gpu_order_modelled"] = arm.lag_snapshots()
        if arm.tier is not None and "refused" not in boot:
            try:
                for s in range(steps):
                    hist.append(arm.step(s, routes[s], logits[s]))
            except Exception as exc:  # noqa: BLE001 - the runner's step fails: serving stops
                boot["serving_error"] = f"step {len(hist)}: {one_line(exc)}"
            boot["final_mapped"] = len(arm.mapped())
    return {
        "boot": boot,
        "steps": hist,
        "totals": totals(hist),
        "errors": arm.errors,
        "warnings": ctx.warnings.of(kind),
        "cuda_stand_in_calls": dict(CALLS),
        "seconds": round(time.perf_counter() - t0, 2),
    }


def totals(hist: list[dict]) -> dict:
    ev = [e for r in hist for e in r["events"]]
    return {
        "steps": len(hist),
        "gate_fires": sum(r["fired"] for r in hist),
        "fire_rounds": sum(len(r["promoted"]) for r in hist),
        "promoted_by_fires": sum(sum(r["promoted"]) for r in hist),
        "promoted_lazy": sum(len(e["ins"]) for e in ev if e["label"] == "lazy"),
        "evicted": sum(len(e["outs"]) for e in ev),
        "fp4_served_final": sum(r["served"][-1] for r in hist),
        "fp4_served_first_forward": sum(r["served"][0] for r in hist),
        "fp4_served_replays": sum(sum(r["served"][1:]) for r in hist),
        "lost_between_forward_and_replay": sum(r["lost"] for r in hist),
        "lost_and_unmapped_at_replay": sum(r["lost_unmapped"] for r in hist),
        "lost_and_routed_again": sum(r["lost_rerouted"] for r in hist),
        "fired_steps_with_loss": sum(r["fired"] and r["lost"] > 0 for r in hist),
        "wrong_byte_slots": sum(r["wrong"] for r in hist),
        "wrong_bytes_served": sum(r["wrong_served"] for r in hist),
        "step_errors": sum(len(r["errors"]) for r in hist),
    }


def compare(a: list[dict], b: list[dict], experts: int) -> dict:
    """Per-step equality, the first differing step, and every event that started from
    the same state in both arms but ended differently (tie-broken or not)."""
    eq = collections.Counter()
    first, same_state = None, []
    for ra, rb in zip(a, b):
        same = {
            "gate_fire": ra["fired"] == rb["fired"],
            "promote_counts": ra["promoted"] == rb["promoted"],
            "fp4_served": ra["served"] == rb["served"],
            "lost": ra["lost"] == rb["lost"],
            "mapped_set_at_final_forward": ra["mapped_digest"] == rb["mapped_digest"],
        }
        eq.update(k for k, v in same.items() if v)
        if first is None and not all(same.values()):
            first = {
                "step": ra["step"],
                "differs": [k for k, v in same.items() if not v],
                "moet": _brief(ra),
                "tierstore": _brief(rb),
            }
        for ea, eb in zip(ra["events"], rb["events"]):
            if ea["label"] != eb["label"]:
                break
            if ea["state"] == eb["state"] and (ea["ins"], ea["outs"]) != (eb["ins"], eb["outs"]):
                same_state.append(_event_diff(ra["step"], ea, eb, experts))
    n = min(len(a), len(b))
    return {
        "steps": n,
        "equal_steps": {
            k: eq[k]
            for k in ("gate_fire", "promote_counts", "fp4_served", "lost", "mapped_set_at_final_forward")
        },
        "first_differing_step": first,
        "same_state_events_that_differ": len(same_state),
        "of_which_tie_breaking": sum(d["tie_breaking"] for d in same_state),
        "examples": same_state[:6],
    }


def _brief(r: dict) -> dict:
    return {k: r[k] for k in ("fired", "promoted", "served", "lost")}


def _event_diff(step: int, ea: dict, eb: dict, E: int) -> dict:
    def pair(keys):
        return [[k // E, k % E] for k in keys]

    tie = ea["in_scores"] == eb["in_scores"] and ea["out_scores"] == eb["out_scores"]
    return {
        "step": step,
        "event": ea["label"],
        "tie_breaking": tie,
        "moet_only_in": pair(sorted(set(ea["ins"]) - set(eb["ins"]))),
        "tierstore_only_in": pair(sorted(set(eb["ins"]) - set(ea["ins"]))),
        "moet_only_out": pair(sorted(set(ea["outs"]) - set(eb["outs"]))),
        "tierstore_only_out": pair(sorted(set(eb["outs"]) - set(ea["outs"]))),
        "scores": {
            "moet_in": ea["in_scores"],
            "tierstore_in": eb["in_scores"],
            "moet_out": ea["out_scores"],
            "tierstore_out": eb["out_scores"],
        },
    }


def side_by_side(ctx, geo, routes, profile, logits, steps, **kw) -> dict:
    planes = make_planes(geo, ctx.seed)
    environ = geo.env(**kw.pop("extra", {}))
    arms = {}
    for kind in KINDS:
        progress(f"{geo.name}: {LABEL[kind]} arm, {steps} steps")
        arms[kind] = serve(ctx, kind, geo, environ, planes, routes, profile, logits, steps, **kw)
    return {
        "geometry": vars(geo) | {"slot_bytes": geo.slot_bytes, "fire_floor": geo.fire_floor},
        "env": environ,
        "arms": arms,
        "comparison": compare(arms["moet"]["steps"], arms["tierstore"]["steps"], geo.experts),
    }


# == 7. the four known divergences =========================================================
def sidecar_layers(directory: str) -> dict:
    """Each pack sidecar in ``directory``: its layers and whether it carries checksums."""
    out = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".json"):
            try:
                with open(os.path.join(directory, name)) as f:
                    meta = json.load(f)
                out[name] = {"layers": meta.get("layers"), "checksums": "checksums" in meta}
            except (OSError, ValueError) as exc:
                out[name] = {"error": one_line(exc)}
    return out


def stop_after(ctx, kind: str, environ: dict, geo, planes, n: int, directory: str) -> dict:
    """A boot that writes ``n`` layers into the pack and then stops (its process dies: the
    module's shutdown closes the store's files, which drops any lock a kill would drop)."""
    info = {}
    with open_arm(ctx, kind, environ, geo, planes) as arm:
        try:
            arm.boot(None, n_stage=n, info=info)
        except Exception as exc:  # noqa: BLE001 - reported
            info["error"] = one_line(exc)
    info["sidecars"] = sidecar_layers(directory)
    return info


def resume(
    ctx, kind: str, environ: dict, geo, planes, routes, profile, logits, steps: int, directory: str
) -> dict:
    """A full boot on the directory (it stages every layer; layers the pack holds are
    skipped), then ``steps`` steps with every slot checked against the planes."""
    import warnings

    info, hist = {}, []
    ctx.warnings.reset()
    with warnings.catch_warnings(record=True) as caught, open_arm(ctx, kind, environ, geo, planes) as arm:
        warnings.simplefilter("always")
        try:
            arm.boot(profile, info=info)
            if arm.tier is not None and "refused" not in info:
                hist = [arm.step(s, routes[s], logits[s]) for s in range(steps)]
        except Exception as exc:  # noqa: BLE001 - reported
            info["error"] = one_line(exc)
    t = totals(hist)
    info["served"] = {
        k: t[k] for k in ("steps", "gate_fires", "promoted_by_fires", "fp4_served_final", "wrong_byte_slots")
    }
    info["warnings"] = ctx.warnings.of(kind)
    info["python_warnings"] = sorted({" ".join(str(w.message).split())[:200] for w in caught})
    info["errors"] = arm.errors
    info["sidecars"] = sidecar_layers(directory)
    return info


def scenario_packs(ctx, geo, routes, profile, logits, steps: int = 10) -> dict:
    """(1) One engine writes half the layers of its pack and stops; the other boots on the
    same STORE_DIR (does it resume them, serve right bytes?); then the first boots again
    (does it accept the pack the other completed?). Both orders."""
    planes, half, out = make_planes(geo, ctx.seed), geo.layers // 2, {}
    for first, second in (("moet", "tierstore"), ("tierstore", "moet")):
        directory = tempfile.mkdtemp(prefix=f"{first}-first-", dir=ctx.tmpdir)
        environ = geo.env(STORE_DIR=directory)
        progress(
            f"divergence 1: {LABEL[first]} writes {half}/{geo.layers} layers, stops; "
            f"{LABEL[second]} boots on its pack; {LABEL[first]} again"
        )
        row = {"stopped": stop_after(ctx, first, environ, geo, planes, half, directory)}
        row["resumed_by_other"] = resume(
            ctx, second, environ, geo, planes, routes, profile, logits, steps, directory
        )
        row["reopened_by_first"] = resume(
            ctx, first, environ, geo, planes, routes, profile, logits, steps, directory
        )
        row["files"] = sorted(os.listdir(directory))
        row["problems"] = _pack_problems(row, half, geo.layers)
        out[f"{first}_then_{second}"] = row
    return {
        "orders": out,
        "reproduces": any(r["problems"] for r in out.values()),
        "expected": f"the second boot finds the {half} layers written, both boots serve "
        "the right bytes, the first engine accepts the completed pack",
    }


def _pack_problems(row: dict, half: int, layers: int) -> list[str]:
    problems = []
    for phase, want in (("resumed_by_other", half), ("reopened_by_first", layers)):
        r = row[phase]
        if "error" in r:
            problems.append(f"{phase}: {r['error']}")
        found = r.get("layers_in_store_before_staging")
        if found is not None and found != want:
            problems.append(f"{phase}: found {found} packed layers before staging, expected {want}")
        if r["served"]["wrong_byte_slots"]:
            problems.append(f"{phase}: {r['served']['wrong_byte_slots']} wrong-byte slots")
    if any(".damaged" in f for f in row["files"]):
        problems.append("a pack was renamed *.damaged and rebuilt")
    return problems


LOSS_KEYS = (
    "gate_fires",
    "fire_rounds",
    "promoted_by_fires",
    "promoted_lazy",
    "fp4_served_first_forward",
    "lost_between_forward_and_replay",
    "lost_and_unmapped_at_replay",
    "lost_and_routed_again",
    "fired_steps_with_loss",
    "wrong_byte_slots",
    "wrong_bytes_served",
)


def scenario_pressure(
    ctx, geo, routes, profile, logits, steps_cpu: int, steps_gpu: int, gpu_ms: float
) -> dict:
    """(2) DELTA_PROMOTE=32, a pool at the fire floor (much smaller than the routed set):
    pairs served at FP4 in a fired step's forward that are unmapped before its replay."""
    out = {}
    for order, lag, steps, ms in (
        ("cpu_event_order", False, steps_cpu, 0.0),
        ("modelled_gpu_event_order", True, steps_gpu, gpu_ms),
    ):
        r = side_by_side(
            ctx, geo, routes, profile, logits, steps, extra={"DELTA_PROMOTE": 32}, lag=lag, gpu_ms=ms
        )
        out[order] = {"steps": steps, "forward_sleep_ms": ms}
        for kind in KINDS:
            arm = r["arms"][kind]
            out[order][kind] = {k: arm["totals"][k] for k in LOSS_KEYS}
            out[order][kind]["warnings"] = arm["warnings"]["count"]
            if "serving_error" in arm["boot"]:
                out[order][kind]["serving_error"] = arm["boot"]["serving_error"]
        if lag:
            out[order]["tierstore_gpu_order_modelled"] = r["arms"]["tierstore"]["boot"].get(
                "gpu_order_modelled"
            )
    return {
        "pool_slots": geo.slots,
        "routed_set": geo.layers * geo.experts,
        "orders": out,
        "reproduces": any(o["tierstore"]["lost_between_forward_and_replay"] > 0 for o in out.values()),
        "moet_loses_too": any(o["moet"]["lost_between_forward_and_replay"] > 0 for o in out.values()),
    }


def scenario_auto(ctx, geo, routes, profile, logits, steps: int = 15) -> dict:
    """(3) DELTA_GB=auto, GATE=1, DELTA_RESERVE_GB=0 and free memory under the fire floor,
    for 0 slots, and above the floor (control); V1 (checks the floor) and V2 (does not)."""
    planes, sb = make_planes(geo, ctx.seed), geo.slot_bytes
    environ = geo.env(DELTA_GB="auto", DELTA_RESERVE_GB=0)
    cases = {
        "free_under_floor": (geo.fire_floor - 16) * sb,
        "free_for_0_slots": sb // 2,
        "free_above_floor": (geo.fire_floor + 24) * sb,
    }
    out = {}
    for runner in ("v1", "v2"):
        for case, free in cases.items():
            progress(f"divergence 3: auto pool, {runner}, {case}")
            row = out.setdefault(runner, {}).setdefault(case, {"free_slots": free // sb})
            for kind in KINDS:
                r = serve(
                    ctx,
                    kind,
                    geo,
                    environ,
                    planes,
                    routes,
                    profile,
                    logits,
                    steps,
                    runner=runner,
                    free_bytes=free,
                )
                row[kind] = _auto_outcome(r, geo.fire_floor)
    served = [
        out["v1"][c]["tierstore"]["outcome"].startswith("serves")
        for c in ("free_under_floor", "free_for_0_slots")
    ]
    return {
        "fire_floor": geo.fire_floor,
        "runners": out,
        "reproduces": any(served),
        "expected": "V1 refuses a pool under the fire floor at boot (after sizing it)",
    }


def _auto_outcome(r: dict, floor: int) -> dict:
    b = r["boot"]
    if "refused" in b:
        return {"outcome": "boot refused", "why": b["refused"]}
    if "serving_error" in b and not r["steps"]:
        return {
            "outcome": "refuses the first step",
            "why": b["serving_error"],
            "finalize_auto_warning": b.get("finalize_auto_warning"),
        }
    n = b.get("n_slots", 0)
    t = r["totals"]
    what = (
        "serves 0-slot inert tier, gate armed" if n == 0 else ("serves sub-floor" if n < floor else "serves")
    )
    return {
        "outcome": what,
        "n_slots": n,
        "layers_in_store": b.get("layers_in_store"),
        "finalize_auto_warning": b.get("finalize_auto_warning"),
        "gate_fires": t["gate_fires"],
        "promoted_by_fires": t["promoted_by_fires"],
        "fp4_served_final": t["fp4_served_final"],
        "wrong_byte_slots": t["wrong_byte_slots"],
    }


def scenario_register(ctx, geo, routes, profile, logits) -> dict:
    """(4) VLLM_MOE_W2_TIERSTORE unset and malformed values: does register() raise? And
    what vLLM-Moet's own boot does with the same values (no STORE_DIR)."""
    from tierstore.adapters import vllm_moet as vm

    bad = {"ZERO_MODE": "abc", "DELTA_RESERVE_GB": "nan", "DELTA_MAX_GB": "inf"}
    cases = [(f"{k}={v}", {P + k: v}) for k, v in bad.items()]
    cases.append(("all three", {P + k: v for k, v in bad.items()}))
    planes, rows = make_planes(geo, ctx.seed), {}
    for name, bad_env in cases:
        progress(f"divergence 4: register() with the plugin off and {name}")
        set_env(bad_env)
        vm.reset_env()
        try:
            vm.register()
            row = {"register": "returned", "raises": False, "installed": vm._TARGET is not None}
        except Exception as exc:  # noqa: BLE001 - the point of the scenario
            row = {"register": f"raised {one_line(exc)}", "raises": True}
        finally:
            vm.uninstall()
            vm.reset_env()
        try:
            r = serve(ctx, "moet", geo, {**geo.env(), **bad_env}, planes, routes, profile, logits, 3)
            row["moet_boot"] = "ok" if not r["boot"].get("refused") else r["boot"]["refused"]
        except Exception as exc:  # noqa: BLE001 - reported
            row["moet_boot"] = f"error {one_line(exc)}"
        rows[name] = row
    return {
        "cases": rows,
        "reproduces": any(r["raises"] for r in rows.values()),
        "expected": "register() does nothing when VLLM_MOE_W2_TIERSTORE is not 1",
    }


# == 8. report ================================================================================
TOTAL_ROWS = (
    ("gate_fires", "gate fires"),
    ("fire_rounds", "fire rounds (promote calls)"),
    ("promoted_by_fires", "promoted by fires"),
    ("promoted_lazy", "promoted by manager"),
    ("evicted", "evicted"),
    ("fp4_served_final", "FP4-served, final forward"),
    ("fp4_served_first_forward", "FP4-served, first forward"),
    ("lost_between_forward_and_replay", "lost slot between forward and replay"),
    ("lost_and_unmapped_at_replay", "  of which unmapped at the replay"),
    ("wrong_byte_slots", "slots with wrong bytes"),
    ("step_errors", "step errors"),
)


def render(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    m = report["meta"]
    ts = m["tierstore"]
    which = f"tierstore {ts.get('commit_requested') or ts.get('git') or '?'} ({(ts.get('sha') or '?')[:10]})"
    con.print(
        f"vLLM-Moet {m['moet_commit'][:12]} ({m['moet_repo']}), files from {PATCH}: "
        f"{', '.join(f['path'].rsplit('/', 1)[-1] for f in m['extracted'])}; "
        f"{which} from {ts['path']}"
    )
    for name, run in report["runs"].items():
        if "skipped" in run:
            con.print(f"[bold]{name}[/]: skipped ({run['skipped']})")
            continue
        g, c = run["geometry"], run["comparison"]
        t = Table(
            title=f"{name}: {g['layers']} layers x {g['experts']} experts, top-{g['top_k']}, "
            f"{g['slots']} slots (fire floor {g['fire_floor']}), {c['steps']} steps"
        )
        for col in ("", "vLLM-Moet", "tierstore", "equal steps"):
            t.add_column(col, justify="left" if not col else "right")
        eq = c["equal_steps"]
        eq_of = {
            "gate_fires": "gate_fire",
            "fire_rounds": "promote_counts",
            "fp4_served_final": "fp4_served",
            "lost_between_forward_and_replay": "lost",
        }
        for key, label in TOTAL_ROWS:
            e = eq_of.get(key)
            t.add_row(
                label,
                str(run["arms"]["moet"]["totals"][key]),
                str(run["arms"]["tierstore"]["totals"][key]),
                f"{eq[e]}/{c['steps']}" if e else "",
            )
        t.add_row(
            "mapped set at the final forward", "", "", f"{eq['mapped_set_at_final_forward']}/{c['steps']}"
        )
        con.print(t)
        con.print(_difference_line(c))
    d = Table(title=f"known divergences, against {which}")
    for col in ("#", "scenario", "vLLM-Moet", "tierstore", "reproduces"):
        d.add_column(col)
    for row in divergence_rows(report["divergences"]):
        d.add_row(*row)
    con.print(d)


def _difference_line(c: dict) -> str:
    f = c["first_differing_step"]
    if f is None:
        return "  identical at every step"
    return (
        f"  first differing step {f['step']} ({', '.join(f['differs'])}); events that began "
        f"in the same state and ended differently: {c['same_state_events_that_differ']}, "
        f"of which tie-breaking (same multiset of scores): {c['of_which_tie_breaking']}"
    )


def divergence_rows(div: dict) -> list[tuple[str, ...]]:
    def yes(v):
        return "[red]yes[/]" if v else "[green]no[/]"

    p, rows = div["1_pack_left_unfinished"], []
    for order, r in p["orders"].items():
        res, reo = r["resumed_by_other"], r["reopened_by_first"]
        first = order.split("_then_")[0]
        rows.append(
            (
                "1",
                f"pack unfinished by {LABEL[first]}, resumed",
                _pack_cell(reo if first == "moet" else res),
                _pack_cell(res if first == "moet" else reo),
                yes(bool(r["problems"])),
            )
        )
    q = div["2_lost_between_forward_and_replay"]
    for order, o in q["orders"].items():
        rows.append(
            (
                "2",
                f"DELTA_PROMOTE=32, pool {q['pool_slots']}: lost pairs ({order})",
                str(o["moet"]["lost_between_forward_and_replay"]),
                str(o["tierstore"]["lost_between_forward_and_replay"]),
                yes(o["tierstore"]["lost_between_forward_and_replay"] > 0),
            )
        )
    a = div["3_auto_pool_under_fire_floor"]
    for case in ("free_under_floor", "free_for_0_slots", "free_above_floor"):
        r = a["runners"]["v1"][case]
        rows.append(
            (
                "3",
                f"auto + gate, V1, {case} ({r['free_slots']} slots)",
                _auto_cell(r["moet"]),
                _auto_cell(r["tierstore"]),
                yes(case != "free_above_floor" and r["tierstore"]["outcome"].startswith("serves")),
            )
        )
    for name, r in div["4_register_with_plugin_off"]["cases"].items():
        rows.append(
            (
                "4",
                f"plugin off, {name}: register()",
                f"boot {r['moet_boot'][:40]}",
                r["register"][:60],
                yes(r["raises"]),
            )
        )
    return rows


def _pack_cell(r: dict) -> str:
    if "error" in r:
        return r["error"][:60]
    return f"found {r.get('layers_in_store_before_staging')} layers, {r['served']['wrong_byte_slots']} wrong"


def _auto_cell(r: dict) -> str:
    if not r["outcome"].startswith("serves"):
        return r["outcome"]
    return f"{r['outcome']} ({r['n_slots']} slots, {r['promoted_by_fires']} promoted)"


def write_json(path: str, report: dict) -> None:
    def plain(o):
        if isinstance(o, (np.integer, np.floating, np.bool_)):
            return o.item()
        raise TypeError(type(o).__name__)

    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".moet_side_by_side.", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(report, f, indent=1, default=plain)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def compact_steps(run: dict) -> None:
    """Per-step rows for the JSON: both arms side by side, without the event lists."""
    rows = []
    for ra, rb in zip(run["arms"]["moet"]["steps"], run["arms"]["tierstore"]["steps"]):
        rows.append(
            {
                "step": ra["step"],
                **{
                    k: {
                        f: r[f]
                        for f in (
                            "fired",
                            "promoted",
                            "served",
                            "lost",
                            "lost_unmapped",
                            "lost_rerouted",
                            "wrong",
                            "errors",
                        )
                    }
                    for k, r in (("moet", ra), ("tierstore", rb))
                },
            }
        )
    for arm in run["arms"].values():
        del arm["steps"]
    run["steps"] = rows


# == 9. main ===================================================================================
def run_all(ctx, args) -> dict:
    rounds = 3  # GATE_FP_MAX default
    syn = Geometry("synthetic", 6, 32, 4, slots=48)
    routes, profile = zipf_router(syn, args.steps, rounds, args.seed)
    logits = gate_logits(args.steps, args.seed, 0.3)
    runs = {"synthetic": side_by_side(ctx, syn, routes, profile, logits, args.steps)}
    if args.trace and os.path.exists(args.trace):
        geo, troutes, tprofile = trace_router(args.trace, args.steps, rounds, args.seed, 96)
        runs["trace"] = side_by_side(ctx, geo, troutes, tprofile, logits, args.steps)
        runs["trace"]["source"] = args.trace
    else:
        runs["trace"] = {"skipped": f"{args.trace} not found" if args.trace else "no --trace given"}
    hot = gate_logits(args.steps, args.seed + 1, 0.5)
    tight = Geometry("pressure", syn.layers, syn.experts, syn.top_k, slots=syn.fire_floor)
    div = {
        "1_pack_left_unfinished": scenario_packs(ctx, syn, routes, profile, logits),
        "2_lost_between_forward_and_replay": scenario_pressure(
            ctx, tight, routes, profile, hot, min(args.steps, 120), min(args.steps, 60), args.gpu_forward_ms
        ),
        "3_auto_pool_under_fire_floor": scenario_auto(ctx, syn, routes, profile, hot),
        "4_register_with_plugin_off": scenario_register(ctx, syn, routes, profile, logits),
    }
    return {"runs": runs, "divergences": div}


def setup_logging(verbose: bool) -> WarningCount:
    counter = WarningCount()
    for name in ("vllm", "tierstore"):
        lg = logging.getLogger(name)
        lg.addHandler(counter)
        lg.setLevel(logging.INFO if verbose else logging.WARNING)
        lg.propagate = verbose
    if verbose:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    return counter


def export_tierstore(rev: str, dest: str) -> tuple[str, str]:
    """``git archive REV tierstore`` of this script's repository into ``dest``, with the
    installed ``tierstore/_C`` linked in (found on sys.path without importing tierstore)."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    git = ["git", "-C", repo]
    sha = subprocess.run(
        git + ["rev-parse", "--verify", f"{rev}^{{commit}}"], capture_output=True, text=True, check=False
    )
    if sha.returncode != 0:
        raise Fatal(f"--tierstore-commit {rev}: not a commit of {repo}")
    if subprocess.run(git + ["diff", "--quiet", rev, "HEAD", "--", "csrc"], check=False).returncode != 0:
        raise Fatal(f"--tierstore-commit {rev}: csrc differs from HEAD; the installed _C would not match")
    built = [
        os.path.join(p, "tierstore", n)
        for p in sys.path
        if os.path.isdir(os.path.join(p, "tierstore"))
        for n in os.listdir(os.path.join(p, "tierstore"))
        if n.startswith("_C.")
    ]
    if not built:
        raise Fatal("no installed tierstore/_C*.so to link into the exported tree")
    os.makedirs(dest)
    archive = subprocess.run(git + ["archive", rev, "tierstore"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", dest], input=archive.stdout, check=True)
    os.symlink(built[0], os.path.join(dest, "tierstore", os.path.basename(built[0])))
    return dest, sha.stdout.strip()


def use_tierstore(src: str | None) -> dict:
    """Import tierstore (from ``src`` when given: the editable install's redirecting
    finder is dropped from this process's meta path so that ``src`` wins)."""
    if src is not None:
        pkg = os.path.join(os.path.abspath(src), "tierstore")
        if not os.path.isfile(os.path.join(pkg, "__init__.py")):
            raise Fatal(f"--tierstore-src {src}: no tierstore/__init__.py there")
        if not any(n.startswith("_C.") for n in os.listdir(pkg)):
            raise Fatal(f"--tierstore-src {src}: no built tierstore/_C*.so there (link the installed one)")
        sys.meta_path[:] = [f for f in sys.meta_path if "ScikitBuild" not in type(f).__name__]
        sys.path.insert(0, os.path.abspath(src))
    import tierstore

    importlib.import_module("tierstore.adapters.vllm_moet")  # fails here, not mid-run
    where = os.path.dirname(os.path.dirname(os.path.abspath(tierstore.__file__)))

    def git(*a):
        return subprocess.run(["git", "-C", where, *a], capture_output=True, text=True, check=False)

    head, desc = git("rev-parse", "HEAD"), git("describe", "--always", "--dirty")
    return {
        "path": where,
        "sha": head.stdout.strip() if head.returncode == 0 else None,
        "git": desc.stdout.strip() if desc.returncode == 0 else None,
    }


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--moet-repo", required=True, help="a checkout of vLLM-Moet (its patch/ is read at run time)"
    )
    ap.add_argument("--steps", type=int, default=200, help="decode steps per run (default 200)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--trace",
        default=None,
        help="a routing trace, [tick, layer, expert] int32 .npy, for the real-trace "
        "run (e.g. FLAME-MoE-290M; default: the synthetic run only)",
    )
    ap.add_argument(
        "--gpu-forward-ms",
        type=float,
        default=12.0,
        help="forward time in scenario 2's modelled GPU order (default 12)",
    )
    ap.add_argument(
        "--tierstore-commit",
        metavar="REV",
        action="append",
        help="run tierstore as of REV of this repository (`git archive` into the "
        "temp dir, the installed _C linked in; csrc must be unchanged); "
        "repeat it to run each in a child process and merge the reports "
        "('installed' = the installed tree)",
    )
    ap.add_argument(
        "--tierstore-src",
        metavar="DIR",
        help="import tierstore from DIR/tierstore (e.g. a `git archive` of another "
        "commit with the built _C linked in) instead of the installed one",
    )
    ap.add_argument("--json", metavar="OUT", help="write the full report here (atomic)")
    ap.add_argument("-v", "--verbose", action="store_true", help="their and our logs to stderr")
    args = ap.parse_args(argv)
    if args.steps < 10:
        ap.error("--steps must be at least 10")
    if args.tierstore_commit and args.tierstore_src:
        ap.error("--tierstore-commit and --tierstore-src exclude each other")
    if args.trace and not os.path.isfile(args.trace):
        ap.error(f"--trace {args.trace}: no such file")
    return args


def run_each_commit(args) -> int:
    """One child process per --tierstore-commit (a process imports one tierstore), the
    reports merged into one JSON: {"meta", "by_tierstore": {rev: report}}."""
    reports, t0 = {}, time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="moet-side-by-side-runs-") as tmp:
        for i, rev in enumerate(args.tierstore_commit):
            out = os.path.join(tmp, f"{i}.json")
            cmd = [
                sys.executable,
                os.path.abspath(__file__),
                "--moet-repo",
                args.moet_repo,
                "--steps",
                str(args.steps),
                "--seed",
                str(args.seed),
                "--gpu-forward-ms",
                str(args.gpu_forward_ms),
                "--json",
                out,
            ]
            cmd += ["--trace", args.trace] if args.trace else []
            cmd += [] if rev == "installed" else ["--tierstore-commit", rev]
            cmd += ["-v"] if args.verbose else []
            progress(f"tierstore {rev}: a child run")
            rc = subprocess.run(cmd, check=False).returncode
            if rc != 0:
                return rc
            with open(out) as f:
                reports[rev] = json.load(f)
    render_summary(reports)
    if args.json:
        write_json(
            args.json,
            {
                "meta": {
                    "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
                    "tierstore_runs": args.tierstore_commit,
                    "seconds": round(time.perf_counter() - t0, 1),
                },
                "by_tierstore": reports,
            },
        )
        progress(f"wrote {args.json}")
    return 0


def render_summary(reports: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="per tierstore: does each known divergence reproduce?")
    t.add_column("")
    for rev, r in reports.items():
        t.add_column(f"{rev} ({(r['meta']['tierstore'].get('sha') or '?')[:10]})")
    div = [r["divergences"] for r in reports.values()]
    for key in div[0]:
        t.add_row(key, *("[red]yes[/]" if d[key]["reproduces"] else "[green]no[/]" for d in div))
    for name in ("synthetic", "trace"):
        cells = []
        for r in reports.values():
            run = r["runs"][name]
            if "arms" not in run:
                cells.append("skipped")
                continue
            c, a = run["comparison"], run["arms"]
            cells.append(
                f"FP4-served {a['moet']['totals']['fp4_served_final']} vs "
                f"{a['tierstore']['totals']['fp4_served_final']}, mapped set equal "
                f"{c['equal_steps']['mapped_set_at_final_forward']}/{c['steps']}"
            )
        t.add_row(f"{name}: vLLM-Moet vs tierstore", *cells)
    Console().print(t)


def main(argv=None) -> int:
    args = parse_args(argv)
    if len(args.tierstore_commit or []) > 1:
        return run_each_commit(args)
    t0 = time.perf_counter()
    try:
        patch, commit = read_patch(args.moet_repo)
        files = new_files(patch, [UTILS + n + ".py" for n in THEIRS])
    except Fatal as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    cuda = CpuCuda()
    with tempfile.TemporaryDirectory(prefix="moet-side-by-side-") as tmp:
        try:
            src = args.tierstore_src
            rev = (args.tierstore_commit or [None])[0]
            if rev not in (None, "installed"):
                src, sha = export_tierstore(rev, os.path.join(tmp, "tierstore-src"))
            tierstore_info = use_tierstore(src)
            if rev not in (None, "installed"):
                tierstore_info.update(commit_requested=rev, sha=sha, git=None)
        except Fatal as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        build_tree(os.path.join(tmp, "tree"), files)
        progress(f"vLLM-Moet {commit[:12]}: {len(files)} files extracted to {tmp}/tree")
        ctx = types.SimpleNamespace(
            tree=os.path.join(tmp, "tree"),
            tmpdir=tmp,
            cuda=cuda,
            proxy=TorchProxy(cuda),
            warnings=setup_logging(args.verbose),
            seed=args.seed,
        )
        try:
            report = run_all(ctx, args)
        except Fatal as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    for run in report["runs"].values():
        if "arms" in run:
            compact_steps(run)
    report["meta"] = {
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "moet_repo": args.moet_repo,
        "moet_commit": commit,
        "patch": PATCH,
        "extracted": [
            {"path": p, "lines": t.count("\n"), "sha256": hashlib.sha256(t.encode()).hexdigest()[:16]}
            for p, t in files.items()
        ],
        "tierstore": tierstore_info,
        "steps": args.steps,
        "seed": args.seed,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "seconds": round(time.perf_counter() - t0, 1),
        "stand_ins": STAND_INS,
    }
    render(report)
    if args.json:
        write_json(args.json, report)
        progress(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

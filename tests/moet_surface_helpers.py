"""Shared pieces of the vLLM-Moet surface tests (not a test module)."""

from __future__ import annotations

import contextlib

import torch

from tierstore.adapters import vllm_moet as vm

P = "VLLM_MOE_W2_"
L, E, W13, W2 = 3, 16, 8192, 4096  # 12 KiB slots: page multiples, like DS4's 12 MiB
SLOT = W13 + W2


def planes(seed: int = 0, n_layers: int = L, n_experts: int = E):
    g = torch.Generator().manual_seed(seed)
    return {
        k: (
            torch.randint(0, 256, (n_experts, W13), dtype=torch.uint8, generator=g),
            torch.randint(0, 256, (n_experts, W2), dtype=torch.uint8, generator=g),
        )
        for k in range(n_layers)
    }


def env(store_dir=None, slots=12, **extra) -> dict:
    e = {
        P + "NUM_LAYERS": str(L - 1),
        P + "CKPT_ID": "tierstore-test-ckpt",
        P + "GATE": "1",
        P + "STORE_THREADS": "2",
    }
    if store_dir is not None:
        e[P + "STORE_DIR"] = str(store_dir)
    e[P + "DELTA_GB"] = "auto" if slots is None else repr(slots * SLOT / 2**30)
    e.update({P + k: str(v) for k, v in extra.items()})
    return e


@contextlib.contextmanager
def moet_env(monkeypatch, environ: dict):
    """The module's singletons on ``environ`` for one test (os.environ too: FORCE_POOL
    is read at the check), torn down after."""
    for k, v in environ.items():
        monkeypatch.setenv(k, v)
    vm.reset_env(environ)
    try:
        yield vm
    finally:
        try:
            vm.shutdown()
        finally:
            vm.reset_env()


def pack_reference(tier):
    """reference(layer, expert) -> the row bytes as the pack on disk holds them."""
    from tierstore.format.pack import Pack

    pack = Pack.open(tier._store.path)

    def ref(layer, expert):
        return torch.from_numpy(pack.read_row(layer, expert).copy())

    return ref


def serve_checked(eng, steps: int, reference=None) -> int:
    """``steps`` gated steps of a booted MoetEngine, every mapped slot checked against
    ``reference`` (or the planes) at each phase and every output checked; returns how
    many experts were promoted, after asserting some were and some stay mapped."""
    promoted = 0
    for _ in range(steps):
        rec = eng.step(fire=True, on_step=lambda phase: eng.check(reference))
        assert rec["out"] == eng.expected_out()  # the (replayed) forward read valid rows
        promoted += rec["promoted"]
    assert promoted > 0 and eng.check(reference) > 0
    return promoted

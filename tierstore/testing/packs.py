"""Helpers for tests and benchmarks: packs of random bytes written through PackWriter."""

from __future__ import annotations

import os

import numpy as np

from tierstore.format import Pack, PackWriter

RANDOM_QUANTIZER_ABI = "tierstore-random-v1"


def random_layer_rows(seed: int, layer: int, n_experts: int, slot_bytes: int) -> np.ndarray:
    """The rows ``make_random_pack`` writes for ``layer``: uint8 [E, slot_bytes], every
    byte in 1..255 (never zero, so a hole or a zero-filled copy can't pass as data)."""
    rng = np.random.default_rng([seed, layer])
    return rng.integers(1, 256, size=(n_experts, slot_bytes), dtype=np.uint8)


def make_random_pack(
    dir: str | os.PathLike,
    n_layers: int,
    n_experts: int,
    slot_bytes: int,
    seed: int = 0,
    layers=None,
    tag: str = "fp4",
) -> Pack:
    """Write a pack of random non-zero rows into ``dir`` and open it. ``layers`` = the
    layers to write (default all; the rest stay holes). Row (l, e) equals
    ``random_layer_rows(seed, l, n_experts, slot_bytes)[e]``."""
    todo = range(n_layers) if layers is None else sorted(set(int(l) for l in layers))
    with PackWriter(
        dir,
        tag=tag,
        n_layers=n_layers,
        n_experts=n_experts,
        slot_bytes=slot_bytes,
        ckpt_id=f"random-seed{seed}",
        quantizer_abi=RANDOM_QUANTIZER_ABI,
    ) as w:
        for layer in todo:
            w.write_layer(layer, random_layer_rows(seed, layer, n_experts, slot_bytes))
        path = w.path
    return Pack.open(path)

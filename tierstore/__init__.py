"""tierstore: a three-tier store for Mixture-of-Experts expert weights.

    SSD   pack file on disk      all experts, 4 KiB-aligned rows (pread / O_DIRECT)
    RAM   pinned host arena      the hot set, rows are zero-copy DMA sources
    VRAM  fixed-slot GPU pool    one [n_slots, slot_bytes] allocation + int32 slot table

The public names below are imported lazily so ``import tierstore`` stays cheap
and a command that only reads a pack never initialises torch's CUDA state.
"""

from __future__ import annotations

import importlib

from tierstore.errors import (
    BufferBoundsError,
    CapacityError,
    ClosedError,
    ConfigError,
    ForkedError,
    FormatError,
    TierIOError,
    TierstoreError,
)

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    "Pack": "format",
    "PackWriter": "format",
    "PackBusyError": "format",
    "PackReplacedError": "format",
    "RowLayout": "format",
    "RowSection": "format",
    "Engine": "io",
    "Completion": "io",
    "ExpertStore": "store",
    "Ticket": "store",
    "FireResult": "store",
    "StoreStats": "store",
    "fire_floor": "store",
    "UncertaintyGate": "compute",
    "fused_moe": "compute",
}


def __getattr__(name: str):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'tierstore' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


def _native():
    from tierstore import _C

    return _C


def built_with_cuda() -> bool:
    """True when the native extension was compiled with CUDA support."""
    return bool(_native().built_with_cuda())


def cuda_available() -> bool:
    """True when the extension has CUDA support and the driver reports a device."""
    C = _native()
    return bool(C.built_with_cuda()) and C.cuda_device_count() > 0


__all__ = sorted(_LAZY) + [
    "TierstoreError",
    "FormatError",
    "ConfigError",
    "CapacityError",
    "TierIOError",
    "ClosedError",
    "ForkedError",
    "BufferBoundsError",
    "cuda_available",
    "built_with_cuda",
    "__version__",
]

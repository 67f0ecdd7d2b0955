"""The memory an Engine knows: every buffer it may read into or copy out of / into.

Engine.submit takes raw addresses (the store's hot path builds them with one numpy
multiply), so on its own it cannot know how big the memory behind an address is:
issue 15's "a 1 TiB length wrote 512 KiB past a 4 KiB buffer". The engine therefore
keeps a table of known buffers (``Engine.alloc_host`` adds its own; callers add
theirs with ``Engine.register_buffer(tensor_or_array)``) and checks each row's
``[ptr, ptr + length)`` against it before anything is submitted: a row that starts
inside a known buffer must end inside it and be on the right side of the bus
(host for src, device for an H2D dst). A strict engine (``strict_buffers=True``)
also refuses addresses in no known buffer, which makes an out-of-bounds write
impossible through the public API.

Buffers are held by weak reference: a buffer that is freed leaves the table at
once, so a stale address is refused (strict) rather than written into.
"""
from __future__ import annotations

import threading
import weakref

import numpy as np

from tierstore.errors import ConfigError


def describe(obj) -> tuple[int, int, bool]:
    """(address, nbytes, on_device) of a contiguous torch tensor or numpy array."""
    if isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            raise ConfigError("register_buffer: the numpy array must be C-contiguous")
        return int(obj.__array_interface__["data"][0]), int(obj.nbytes), False
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        torch = None
    if torch is not None and isinstance(obj, torch.Tensor):
        if not obj.is_contiguous():
            raise ConfigError("register_buffer: the tensor must be contiguous")
        return int(obj.data_ptr()), obj.numel() * obj.element_size(), obj.device.type == "cuda"
    raise ConfigError(f"register_buffer: expected a torch tensor or numpy array, "
                      f"got {type(obj).__name__}")


class BufferTable:
    """Known buffers, looked up with one searchsorted per column. Thread safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._entries: dict[int, tuple[int, int, bool, weakref.ref]] = {}  # id -> entry
        self._starts = self._ends = np.empty(0, np.uint64)
        self._device = np.empty(0, bool)

    def add(self, obj) -> None:
        ptr, nbytes, device = describe(obj)
        key = id(obj)
        ref = weakref.ref(obj, lambda _r, key=key: self._drop(key))
        with self._lock:
            self._entries[key] = (ptr, nbytes, device, ref)
            self._rebuild()

    def remove(self, obj) -> None:
        self._drop(id(obj))

    def __len__(self) -> int:
        return len(self._entries)

    def _drop(self, key: int) -> None:
        with self._lock:
            if self._entries.pop(key, None) is not None:
                self._rebuild()

    def _rebuild(self) -> None:
        items = sorted((p, p + n, d) for p, n, d, _ in self._entries.values() if n > 0)
        self._starts = np.array([s for s, _, _ in items], np.uint64)
        self._ends = np.array([e for _, e, _ in items], np.uint64)
        self._device = np.array([d for _, _, d in items], bool)

    def check(self, ptrs: np.ndarray, lengths: np.ndarray, device: bool, name: str,
              strict: bool, path: str) -> None:
        """ConfigError naming the first row whose [ptr, ptr+length) is not inside one
        known buffer on the right side (rows with ptr 0 are skipped)."""
        used = ptrs != 0
        if not used.any():
            return
        with self._lock:
            starts, ends, on_dev = self._starts, self._ends, self._device
        idx = np.searchsorted(starts, ptrs, side="right").astype(np.int64) - 1
        found = used & (idx >= 0)
        j = np.maximum(idx, 0)
        if len(starts):
            found &= ptrs < ends[j]
            end = ptrs + lengths                      # wraps on overflow: caught by end < ptr
            inside = found & (end >= ptrs) & (end <= ends[j]) & (on_dev[j] == device)
        else:
            inside = np.zeros_like(used)
        bad = (found & ~inside) | (strict & used & ~found)
        if not bad.any():
            return
        i = int(np.argmax(bad))
        side = "device" if device else "host"
        if found[i]:
            k = int(j[i])
            why = (f"the {'device' if on_dev[k] else 'host'} buffer it points into is "
                   f"{int(ends[k] - starts[k])} B at {int(starts[k]):#x}, the row needs {side} "
                   f"memory up to {int(ptrs[i]) + int(lengths[i]):#x}")
        else:
            why = ("it is in no buffer known to this engine (Engine.alloc_host or "
                   "Engine.register_buffer)")
        raise ConfigError(f"{path}: submit: row {i}: {name} {int(ptrs[i]):#x} + length "
                          f"{int(lengths[i])}: {why}")

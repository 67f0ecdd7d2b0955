"""The memory an Engine knows: every buffer it may read into or copy out of / into.

Engine.submit takes raw addresses (the store's hot path builds them with one numpy
multiply), so on its own it cannot know how big the memory behind an address is:
a 1 TiB length once wrote 512 KiB past a 4 KiB buffer. Every engine therefore
keeps a native table of registered buffers (csrc/io/include/tierstore/io/buffer_table.hpp:
sorted intervals, one binary search per pointer under a lock taken once per submit).
``Engine.alloc_host`` registers its own buffers; callers register theirs with
``Engine.register_buffer(tensor_or_array)`` (or ``with engine.registered(t):`` for the
length of a batch). ``submit`` refuses, before anything is read, any row whose
``[ptr, ptr + length)`` is not inside one registered buffer on the right side of the
bus (host for src, device for an H2D dst): a BufferBoundsError naming the row, its
offset and length, and the buffer. There is no unchecked mode: no caller needs one.

Buffers are held by weak reference: a buffer that is freed leaves the table at once,
so a stale address is refused rather than written into.
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
    raise ConfigError(f"register_buffer: expected a torch tensor or numpy array, got {type(obj).__name__}")


class BufferTable:
    """The Python side of an engine's native buffer table: which objects hold which
    native tokens, so a buffer leaves the table when it is freed. Thread safe."""

    def __init__(self, native):
        self._native = native
        self._lock = threading.Lock()
        self._tokens: dict[int, list[int]] = {}  # id(obj) -> native tokens
        self._refs: dict[int, weakref.ref] = {}

    def add(self, obj) -> int:
        """Register ``obj``; returns the native token (see remove_token)."""
        ptr, nbytes, device = describe(obj)
        if nbytes == 0:
            return 0
        token = int(self._native.register_buffer(ptr, nbytes, device))
        key = id(obj)
        with self._lock:
            self._tokens.setdefault(key, []).append(token)
            if key not in self._refs:
                self._refs[key] = weakref.ref(obj, lambda _r, key=key: self._drop(key))
        return token

    def remove(self, obj) -> None:
        """Drop every registration of ``obj``."""
        self._drop(id(obj))

    def remove_token(self, obj, token: int) -> None:
        """Drop one registration of ``obj`` (the one ``add`` returned ``token`` for)."""
        key = id(obj)
        with self._lock:
            tokens = self._tokens.get(key, [])
            if token in tokens:
                tokens.remove(token)
            if not tokens:
                self._tokens.pop(key, None)
                self._refs.pop(key, None)
        self._native.unregister_buffer(token)

    def __len__(self) -> int:
        return int(self._native.buffer_count)

    def _drop(self, key: int) -> None:
        with self._lock:
            tokens = self._tokens.pop(key, [])
            self._refs.pop(key, None)
        for token in tokens:
            self._native.unregister_buffer(token)

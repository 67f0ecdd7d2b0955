"""Routing traces: the capture format, a validating lazy reader, and a recorder.

Format (vLLM-Moet's capture format): a ``.npy`` of int32 rows
``[tick, layer, expert]`` sorted by tick (then layer, then router rank), one tick
= one forward step (one token of a prefill-like pass, or one decode step of a
batch). ``layer`` is the model's own index (gaps allowed); an optional
``<name>.meta.json`` next to it describes the model. Declared columns: the three
above are required; an optional 4th column ``weight`` (int32 gate weight x 1e4)
is accepted and ignored by the simulator.

Curated traces fail fast: the first bad row is named with file, row and what
was expected against what was found (``FormatError``).

The synthetic DeepSeek-V4-Flash-shaped generator lives in ``tierstore.sim.synth``
and is re-exported here (``SyntheticRouter``, ``synthetic_trace``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import msgspec
import numpy as np

from tierstore.errors import CapacityError, FormatError
from tierstore.files.atomic import write_atomic_with
from tierstore.files.untrusted import open_regular, read_json
from tierstore.memory import check_fits_memory  # noqa: F401 (re-exported)

MAX_META_BYTES = 16 << 20  # a trace's .meta.json is a few hundred bytes
# layers x experts: the replays keep dense state per key (a policy's arrays, the
# prefetcher's tables), so a hostile expert id of 2**31 must not size them. Real models
# have tens of thousands (DeepSeek-V4-Flash: 43 x 256 = 11,008).
MAX_KEYS = 1 << 20


class TraceMeta(msgspec.Struct, frozen=True):
    """The fields of a trace's ``.meta.json`` the simulator reads, typed (the others are
    kept as they are, in ``Trace.meta``)."""

    num_experts: Annotated[int, msgspec.Meta(ge=1, le=MAX_KEYS)] | None = None
    layers_present: list[Annotated[int, msgspec.Meta(ge=0)]] | None = None
    name: str | None = None
    top_k: Annotated[int, msgspec.Meta(ge=1)] | None = None


REQUIRED_COLUMNS = ("tick", "layer", "expert")
OPTIONAL_COLUMNS = ("weight",)


@dataclass
class Trace:
    """A routing trace in memory, with layers remapped to dense indices.

    ``keys`` are the dense ids the policies use: ``layer_index * n_experts +
    expert`` where ``layer_index`` is the position of the row's layer in
    ``layer_ids``. ``tick_starts[i]:tick_starts[i+1]`` are the rows of the i-th
    tick present (ticks with no rows are skipped)."""

    ticks: np.ndarray  # int64 [rows]
    layers: np.ndarray  # int32 [rows], dense layer index
    experts: np.ndarray  # int32 [rows]
    layer_ids: np.ndarray  # int64 [n_layers], the model's own layer numbers
    n_experts: int
    name: str = "trace"
    meta: dict = field(default_factory=dict)

    @property
    def n_layers(self) -> int:
        return int(self.layer_ids.size)

    @property
    def n_keys(self) -> int:
        return self.n_layers * self.n_experts

    @property
    def n_rows(self) -> int:
        return int(self.ticks.size)

    @property
    def keys(self) -> np.ndarray:
        return self.layers.astype(np.int64) * self.n_experts + self.experts

    @property
    def tick_starts(self) -> np.ndarray:
        """int64 [n_ticks + 1] row offsets of each present tick."""
        if self.ticks.size == 0:
            return np.zeros(1, dtype=np.int64)
        change = np.flatnonzero(np.diff(self.ticks)) + 1
        return np.concatenate(([0], change, [self.ticks.size])).astype(np.int64)

    @property
    def n_ticks(self) -> int:
        return int(self.tick_starts.size - 1)

    def iter_ticks(self) -> Iterator[tuple[int, np.ndarray]]:
        """Lazily yield (tick, dense keys of that tick)."""
        keys, starts = self.keys, self.tick_starts
        for i in range(starts.size - 1):
            a, b = starts[i], starts[i + 1]
            yield int(self.ticks[a]), keys[a:b]

    def split(self, fraction: float = 0.5) -> tuple[Trace, Trace]:
        """Two traces at a tick boundary: the first ``fraction`` of ticks and the rest."""
        starts = self.tick_starts
        cut = int(starts[int(round((starts.size - 1) * fraction))])
        parts = []
        for sl, tag in ((slice(0, cut), "a"), (slice(cut, None), "b")):
            parts.append(
                Trace(
                    self.ticks[sl],
                    self.layers[sl],
                    self.experts[sl],
                    self.layer_ids,
                    self.n_experts,
                    f"{self.name}[{tag}]",
                    dict(self.meta),
                )
            )
        return parts[0], parts[1]

    def to_rows(self) -> np.ndarray:
        """int32 [rows, 3] in the capture format (model layer ids restored)."""
        return np.column_stack((self.ticks, self.layer_ids[self.layers], self.experts)).astype(np.int32)


def _meta_path(path: Path) -> Path:
    return (
        path.with_suffix("").with_suffix(".meta.json")
        if path.suffix == ".npy"
        else Path(str(path) + ".meta.json")
    )


def check_key_space(n_layers: int, n_experts: int, what: str) -> None:
    """Refuse (CapacityError starting with ``what``) a key space over MAX_KEYS."""
    n = int(n_layers) * int(n_experts)
    if n > MAX_KEYS:
        raise CapacityError(
            f"{what}: {n_layers} layers x {n_experts} experts = {n:,} keys, "
            f"more than the {MAX_KEYS:,} a replay keeps state for (expert ids "
            "must be dense: 0 .. num_experts - 1)"
        )


def _int64_rows(path, arr: np.ndarray) -> np.ndarray:
    """The [rows, 3] int64 copy validation works on, refused (naming the file) when it
    cannot fit in memory: a header may declare billions of rows over a sparse file."""
    what = f"{path}: {arr.shape[0]} rows"
    check_fits_memory(int(arr.shape[0]) * 3 * 8, what)
    try:
        return np.asarray(arr[:, :3], dtype=np.int64)
    except MemoryError:
        raise CapacityError(f"{what}: out of memory while loading") from None


def load_trace(path: str | os.PathLike, *, n_experts: int | None = None) -> Trace:
    """Read and validate a capture-format trace (memory-mapped, checked in one
    vectorised pass). ``n_experts`` defaults to meta.json's ``num_experts``,
    else max(expert)+1. Raises FormatError naming the file and first bad row."""
    path = Path(path)
    os.close(open_regular(path, "routing trace"))  # a FIFO must not block np.load
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise FormatError(f"{path}: not a .npy routing trace ({exc})") from None
    if arr.ndim != 2 or arr.shape[1] not in (
        len(REQUIRED_COLUMNS),
        len(REQUIRED_COLUMNS) + len(OPTIONAL_COLUMNS),
    ):
        raise FormatError(
            f"{path}: shape {arr.shape}, expected [rows, 3] with columns "
            f"{', '.join(REQUIRED_COLUMNS)} (optional: {', '.join(OPTIONAL_COLUMNS)})"
        )
    if arr.dtype.kind not in "iu":
        raise FormatError(f"{path}: dtype {arr.dtype}, expected int32")
    meta, typed = {}, TraceMeta()
    mp = _meta_path(path)
    if mp.exists():
        meta = read_json(mp, MAX_META_BYTES, "trace metadata")
        if not isinstance(meta, dict):
            raise FormatError(f"{mp}: trace metadata must be a JSON object")
        try:
            typed = msgspec.convert(meta, TraceMeta, strict=True)
        except msgspec.ValidationError as exc:
            raise FormatError(f"{mp}: trace metadata field error: {exc}") from None
    rows = _int64_rows(path, arr)
    ticks, layers, experts = rows[:, 0], rows[:, 1], rows[:, 2]
    if n_experts is None and typed.num_experts is not None:
        n_experts = typed.num_experts
    elif n_experts is None:
        n_experts = int(experts.max()) + 1 if rows.size else 1
        if n_experts > MAX_KEYS:  # before np.unique below; the row names the culprit
            r = int(np.argmax(experts))
            raise FormatError(
                f"{path}: row {r}: expert {int(experts[r])}, more than the "
                f"{MAX_KEYS:,} keys a replay keeps state for (expert ids must "
                "be dense: 0 .. num_experts - 1)"
            )
    _fail_on_first(path, ticks < 0, ticks, "tick", ">= 0")
    if ticks.size > 1:
        back = np.flatnonzero(np.diff(ticks) < 0)
        if back.size:
            r = int(back[0]) + 1
            raise FormatError(
                f"{path}: row {r}: tick {int(ticks[r])} after tick "
                f"{int(ticks[r - 1])}, expected ticks sorted ascending"
            )
    _fail_on_first(path, layers < 0, layers, "layer", ">= 0")
    _fail_on_first(path, (experts < 0) | (experts >= n_experts), experts, "expert", f"in [0, {n_experts})")
    layer_ids, dense = np.unique(layers, return_inverse=True)
    check_key_space(layer_ids.size, n_experts, str(path))
    declared = typed.layers_present
    if declared is not None:
        extra = np.setdiff1d(layer_ids, np.asarray(declared))
        if extra.size:
            r = int(np.flatnonzero(layers == extra[0])[0])
            raise FormatError(
                f"{path}: row {r}: layer {int(extra[0])}, expected one of "
                f"layers_present {declared} from {mp.name}"
            )
    return Trace(
        ticks,
        dense.astype(np.int32),
        experts.astype(np.int32),
        layer_ids.astype(np.int64),
        int(n_experts),
        typed.name if typed.name is not None else path.stem,
        meta,
    )


def _fail_on_first(path, bad: np.ndarray, values: np.ndarray, column: str, expected: str):
    idx = np.flatnonzero(bad)
    if idx.size:
        r = int(idx[0])
        raise FormatError(f"{path}: row {r}: {column} {int(values[r])}, expected {expected}")


def save_trace(path: str | os.PathLike, rows: np.ndarray, meta: dict | None = None) -> Path:
    """Write int32 rows [tick, layer, expert] (+ meta.json) atomically: temp
    file, fsync, rename, so a reader never sees half a trace."""
    path = Path(path)
    rows = np.ascontiguousarray(rows, dtype=np.int32)
    if rows.ndim != 2 or rows.shape[1] != 3:
        raise FormatError(f"{path}: refusing to write shape {rows.shape}, expected [rows, 3]")
    write_atomic_with(path, lambda f: np.save(f, rows, allow_pickle=False))
    if meta is not None:
        body = json.dumps(meta, indent=2, sort_keys=True).encode()
        write_atomic_with(_meta_path(path), lambda f: f.write(body))
    return path


class TraceRecorder:
    """Capture hook for the live store: ``record(layer, topk_ids)`` from the
    forward thread (a cheap append: no I/O, no sort), ``step()`` at each step
    end, ``save(path)`` writes the capture format. Rows keep router rank order.

    Thread safety: one forward thread; ``save`` must not race ``record``."""

    def __init__(self, meta: dict | None = None, start_tick: int = 0):
        self.meta = dict(meta or {})
        self.tick = int(start_tick)
        self._chunks: list[np.ndarray] = []
        self._rows = 0

    def record(self, layer: int, topk_ids) -> None:
        ids = np.asarray(topk_ids).reshape(-1)
        chunk = np.empty((ids.size, 3), dtype=np.int32)
        chunk[:, 0] = self.tick
        chunk[:, 1] = layer
        chunk[:, 2] = ids
        self._chunks.append(chunk)
        self._rows += ids.size

    def step(self) -> None:
        self.tick += 1

    @property
    def n_rows(self) -> int:
        return self._rows

    def rows(self) -> np.ndarray:
        """int32 [rows, 3] sorted by tick then layer, rank order kept (stable)."""
        if not self._chunks:
            return np.empty((0, 3), dtype=np.int32)
        rows = np.concatenate(self._chunks)
        order = np.lexsort((rows[:, 1], rows[:, 0]))  # stable: router rank kept
        return rows[order]

    def save(self, path: str | os.PathLike) -> Path:
        rows = self.rows()
        meta = {
            **self.meta,
            "name": Path(path).stem,
            "n_ticks": int(np.unique(rows[:, 0]).size),
            "columns": list(REQUIRED_COLUMNS),
        }
        return save_trace(path, rows, meta)

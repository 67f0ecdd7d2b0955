"""Pool and arena sizing, and the fire floor.

Order matters (the reference's known defect was checking the floor before an
"auto" pool had been sized, so it refused to start): resolve the slot count
first, then check it against memory, then against the floor.
"""

from __future__ import annotations

import math
import warnings

from tierstore import settings
from tierstore.errors import CapacityError, ConfigError

GIB = 1 << 30
MIN_SLOTS = 8


def or_auto(convert):
    """``convert``, or the word ``auto`` kept as it is."""

    def parse(value):
        if isinstance(value, str) and value.strip().lower() == settings.AUTO:
            return settings.AUTO
        try:
            return convert(value)
        except ValueError as exc:
            raise ValueError(f"{exc}, or auto") from None

    return parse


#: The pool's and the arena's sizes in GiB (ExpertStore's vram_gb / ram_gb): "auto", or a
#: finite size (a pool > 0, an arena >= 0: 0 = none), at most settings.GIB_MAX.
VRAM_GB = or_auto(settings.number(0.0, settings.GIB_MAX, lo_open=True))
RAM_GB = or_auto(settings.gib)


def fire_floor(n_layers: int, top_k: int, n_spec: int = 0, max_seqs: int = 1, gate_fp_max: int = 3) -> int:
    """Fewest pool slots that hold one fire without evicting its own experts.

    ``L * top_k * (1 + n_spec) * min(max(seqs, 1), 4) * (1 + 0.35 * max(gate_fp_max - 1, 0))``
    (vLLM-Moet's formula; DS4 with 1 sequence: 438, MTP1: 877, MTP2: 1315, 4+ seqs: 1754).
    """
    n_layers, top_k = (
        settings.argument(f"fire_floor: {name}", value, settings.positive_count)
        for name, value in (("n_layers", n_layers), ("top_k", top_k))
    )
    n_spec, max_seqs, gate_fp_max = (
        settings.argument(f"fire_floor: {name}", value, settings.count)
        for name, value in (("n_spec", n_spec), ("max_seqs", max_seqs), ("gate_fp_max", gate_fp_max))
    )
    seqs = min(max(max_seqs, 1), 4)
    return int(n_layers * top_k * (1 + n_spec) * seqs * (1 + 0.35 * max(gate_fp_max - 1, 0)))


def slots_for_gib(gib: float, slot_bytes: int) -> int:
    """``max(floor(GiB * 2^30 / slot_bytes), 8)``: the reference's slot count for a GiB budget."""
    return max(int(math.floor(float(gib) * GIB / int(slot_bytes))), MIN_SLOTS)


def host_available_bytes() -> int:
    """MemAvailable from /proc/meminfo (bytes); what the kernel says can still be allocated."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def device_available_bytes(device) -> int:
    """Free memory of the pool's device: cudaMemGetInfo on CUDA, MemAvailable on CPU."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        free, _total = torch.cuda.mem_get_info(dev)
        return int(free)
    return host_available_bytes()


def auto_slots(
    *, slot_bytes: int, n_keys: int, available: int, reserve_gb: float, max_gb: float = 0.0
) -> int:
    """Slots of an auto pool: ``available`` bytes minus ``reserve_gb``, capped by
    ``max_gb`` (0: no cap) and by ``n_keys``; 0 when nothing is left (never negative)."""
    usable = int(available) - int(float(reserve_gb) * GIB)
    if max_gb and max_gb > 0:
        usable = min(usable, int(float(max_gb) * GIB))
    return max(min(usable // int(slot_bytes), int(n_keys)), 0)


def resolve_pool_slots(
    *,
    slot_bytes: int,
    n_keys: int,
    device,
    vram_slots=None,
    vram_gb=None,
    reserve_gb: float = 3.0,
    max_gb: float = 0.0,
    available: int | None = None,
) -> int:
    """Number of pool slots for the arguments given; checks memory, not the floor.

    ``vram_slots`` wins over ``vram_gb``; neither (or ``vram_gb="auto"``) sizes the
    pool from free device memory minus ``reserve_gb``, capped by ``max_gb`` (0: no
    cap). Every size is capped by ``n_keys`` (more slots than experts would never be used).
    Raises CapacityError, before anything is allocated, when the pool would not fit.
    """
    avail = device_available_bytes(device) if available is None else int(available)
    if vram_slots is not None:
        if vram_gb is not None:
            raise ConfigError(f"give vram_slots ({vram_slots}) or vram_gb ({vram_gb}), not both")
        n = settings.argument("vram_slots", vram_slots, settings.positive_count)
        how = f"vram_slots={n}"
    elif (
        vram_gb is not None
        and settings.argument("vram_gb", vram_gb, VRAM_GB, (settings.AUTO,)) != settings.AUTO
    ):
        gib = VRAM_GB(vram_gb)
        n = slots_for_gib(gib, slot_bytes)
        how = f"vram_gb={gib:g}"
    else:
        n = auto_slots(
            slot_bytes=slot_bytes, n_keys=n_keys, available=avail, reserve_gb=reserve_gb, max_gb=max_gb
        )
        if n < 1:
            raise CapacityError(
                f"auto pool on {device}: {avail / GIB:.2f} GiB free minus a {reserve_gb:g} GiB "
                f"reserve leaves no room for one {slot_bytes}-byte slot"
            )
        return int(n)
    # An explicit size is capped by the pack's rows too: more slots than experts would
    # never be used, only allocated (vram_gb=6 on a small pack meant 493,447 slots).
    n = min(n, int(n_keys))
    need = n * int(slot_bytes)
    if need > avail:
        raise CapacityError(
            f"pool of {n} slots x {slot_bytes} bytes ({how}) needs {need / GIB:.2f} GiB "
            f"but {device} has {avail / GIB:.2f} GiB free"
        )
    return n


def resolve_arena_rows(
    *, ram_gb, stride: int, n_keys: int, reserve_gb: float = 3.0, available: int | None = None
) -> int:
    """Rows of the pinned RAM arena: ``ram_gb`` GiB of 4 KiB-strided rows (0: no arena).

    ``"auto"`` = a quarter of the pack (the reference's default), within free host
    memory minus ``reserve_gb``. Raises CapacityError when the arena would not fit.
    """
    avail = host_available_bytes() if available is None else int(available)
    ram_gb = settings.argument("ram_gb", 0.0 if ram_gb is None else ram_gb, RAM_GB, (settings.AUTO,))
    if ram_gb == settings.AUTO:
        rows = max(int(n_keys) // 4, 1)
        rows = min(rows, max(avail - int(float(reserve_gb) * GIB), 0) // int(stride))
        return int(rows)
    gib = ram_gb
    rows = min(int(gib * GIB) // int(stride), int(n_keys))
    if rows * int(stride) > avail:
        raise CapacityError(
            f"arena of {rows} rows x {stride} bytes (ram_gb={gib:g}) needs "
            f"{rows * stride / GIB:.2f} GiB but the host has {avail / GIB:.2f} GiB free"
        )
    return int(rows)


def check_floor(n_slots: int, floor: int, *, slot_bytes: int, force: bool, what: str) -> None:
    """Refuse a pool under the fire floor, or warn when ``force`` is set."""
    if n_slots >= floor:
        return
    msg = (
        f"pool of {n_slots} slots is under the fire floor of {floor} slots "
        f"({floor * slot_bytes / GIB:.2f} GiB at {slot_bytes} bytes a slot; {what})"
    )
    if not force:
        raise CapacityError(msg + "; give a larger pool or force=True")
    warnings.warn(msg + "; continuing because force=True", RuntimeWarning, stacklevel=3)

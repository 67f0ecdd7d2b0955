"""Match a warm file against a pack: a warm file is a hint, never trusted.

``fit_to_pack`` raises FormatError when the file describes another pack (tag,
geometry, and for a poolmon the checkpoint identity): warming a same-geometry
pack of another checkpoint would serve plausible wrong experts. Entries that
cannot be honoured are dropped and counted per reason (out of range, a layer
the pack has not written, duplicates). ``load_hint`` wraps both with the
warm-start policy: any problem -> one warning line naming the file and the
reason, and ``None`` (a cold start).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import replace

import numpy as np

from tierstore.errors import FormatError, TierIOError
from tierstore.warm.formats import PackIdentity, WarmFile, WarmTier, read_warm_file


class WarmStartWarning(UserWarning):
    """A warm-start file was ignored or partly ignored; the store starts colder."""


_IDENTITY_FIELDS = ("tag", "n_layers", "n_experts", "slot_bytes", "stride", "ckpt_id", "key20")


def identity_mismatches(found: PackIdentity, expected: PackIdentity) -> list[str]:
    """'field found X, expected Y' for every field both sides know and disagree on."""
    out = []
    for name in _IDENTITY_FIELDS:
        a, b = getattr(found, name), getattr(expected, name)
        if a is not None and b is not None and a != b:
            out.append(f"{name} {a!r}, pack has {b!r}")
    return out


def check_identity(wf: WarmFile, expected: PackIdentity, what: str = "pack") -> None:
    if wf.identity is None:
        return
    bad = identity_mismatches(wf.identity, expected)
    if bad:
        raise FormatError(f"{wf.path}: {wf.kind} is for another {what}: " + "; ".join(bad))


def fit_tier(
    tier: WarmTier, n_layers: int, n_experts: int, written: np.ndarray | None, skipped: dict, label: str
) -> WarmTier:
    keys = tier.keys
    if not len(keys):
        return tier
    layer, expert = keys[:, 0], keys[:, 1]
    in_range = (layer < n_layers) & (expert < n_experts)  # >= 0 checked at parse
    if (~in_range).any():
        skipped[f"{label}: out of range"] = skipped.get(f"{label}: out of range", 0) + int((~in_range).sum())
    keep = in_range
    if written is not None:
        is_written = np.zeros(len(keys), bool)
        is_written[in_range] = written[layer[in_range]]
        holes = in_range & ~is_written
        if holes.any():
            skipped[f"{label}: layer not written"] = int(holes.sum())
        keep = keep & is_written
    keys, heat = keys[keep], tier.heat[keep]
    dense = keys[:, 0] * n_experts + keys[:, 1]
    _, first = np.unique(dense, return_index=True)
    if len(first) < len(dense):
        skipped[f"{label}: duplicate"] = len(dense) - len(first)
        first.sort()  # keep the hottest (earliest) occurrence, in order
        keys, heat = keys[first], heat[first]
    return WarmTier(keys, heat, tier.capacity, tier.ranked)


def fit_to_pack(wf: WarmFile, pack) -> WarmFile:
    """``wf`` restricted to what ``pack`` can serve. Raises FormatError on an
    identity or geometry mismatch; drops (and counts in ``.skipped``) entries
    out of range, in unwritten layers, or repeated."""
    expected = PackIdentity.of_pack(pack)
    check_identity(wf, expected)
    written = getattr(pack, "written", None)
    written = None if written is None else np.asarray(written, dtype=bool)
    skipped = dict(wf.skipped)
    pool = fit_tier(wf.pool, expected.n_layers, expected.n_experts, written, skipped, "pool")
    arena = fit_tier(wf.arena, expected.n_layers, expected.n_experts, written, skipped, "arena")
    return replace(wf, pool=pool, arena=arena, skipped=skipped)


def describe_skipped(skipped: dict) -> str:
    """'3 pool: out of range, 1 pool: duplicate' for a warning or a summary."""
    return ", ".join(f"{n} {reason}" for reason, n in skipped.items())


def load_hint(src, pack, *, stacklevel: int = 2) -> WarmFile | None:
    """Read ``src`` (path or WarmFile) and fit it to ``pack`` as a hint.

    Returns the fitted WarmFile, or None (cold start) after ONE warning naming
    the file and the reason when it is missing, unreadable, corrupt, of another
    version, or for another pack. Dropped entries give one warning too, and the
    rest of the file is used. Never raises for a bad file.
    """
    path = src.path if isinstance(src, WarmFile) else os.fspath(src)
    try:
        wf = src if isinstance(src, WarmFile) else read_warm_file(path)
        fitted = fit_to_pack(wf, pack)
    except FileNotFoundError:
        warnings.warn(
            f"{path}: warm-start file not found; starting cold", WarmStartWarning, stacklevel=stacklevel + 1
        )
        return None
    except (FormatError, TierIOError, OSError) as exc:
        msg = str(exc) if str(exc).startswith(path) else f"{path}: {exc}"
        warnings.warn(f"{msg}; starting cold", WarmStartWarning, stacklevel=stacklevel + 1)
        return None
    except Exception as exc:  # noqa: BLE001 - a hint must never stop the server
        warnings.warn(
            f"{path}: unreadable warm-start file ({type(exc).__name__}: {exc}); starting cold",
            WarmStartWarning,
            stacklevel=stacklevel + 1,
        )
        return None
    if fitted.skipped:
        warnings.warn(
            f"{path}: dropped entries ({describe_skipped(fitted.skipped)}); "
            f"warming with the remaining {len(fitted.pool)} pool and "
            f"{len(fitted.arena)} arena entries",
            WarmStartWarning,
            stacklevel=stacklevel + 1,
        )
    return fitted

"""Offline tools on warm files: merge several runs, summarise one (``tierstore warm``).

Merge semantics: every input tier's heat is first turned into *shares* (heat /
sum of the tier's heat; files without scores use their rank heat), so a poolmon
from a long run does not drown a short one just because its decayed counts are
larger. Each file's shares are weighted by ``0.5 ** (age / half_life_s)``, age
being seconds between its ``wall_time`` (file mtime for formats without one)
and the newest input's; the weighted shares are summed per (layer, expert).
The merged heat is therefore "expected share of accesses", comparable across
tiers and runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from tierstore.errors import FormatError
from tierstore.warm.formats import PackIdentity, PoolmonCounters, TierCounters, WarmFile, WarmTier
from tierstore.warm.validate import fit_tier, identity_mismatches

TOP_N = 64  # one fire's worth of rows


def _merged_identity(files: Sequence[WarmFile], given: PackIdentity | None) -> PackIdentity | None:
    ref, ref_path = given, "--pack"
    for wf in files:
        if wf.identity is None:
            continue
        if ref is None:
            ref, ref_path = wf.identity, wf.path
            continue
        bad = identity_mismatches(wf.identity, ref)
        if bad:
            raise FormatError(
                f"{wf.path}: does not match {ref_path}: "
                + "; ".join(b.replace("pack has", "expected") for b in bad)
            )
        # fill fields the reference lacks (a pool-heat file has no ckpt_id)
        ref = PackIdentity(
            **{
                f: getattr(ref, f) if getattr(ref, f) is not None else getattr(wf.identity, f)
                for f in ref.__struct_fields__
            }
        )
    return ref


def check_range(wf: WarmFile, ident: PackIdentity) -> None:
    """FormatError naming the first entry of ``wf`` outside ``ident``'s geometry."""
    for label, tier in (("pool", wf.pool), ("arena", wf.arena)):
        if not len(tier):
            continue
        bad = np.flatnonzero((tier.keys[:, 0] >= ident.n_layers) | (tier.keys[:, 1] >= ident.n_experts))
        if bad.size:
            l, e = tier.keys[bad[0]].tolist()
            raise FormatError(
                f"{wf.path}: {label} entry {int(bad[0])} is layer {l} expert {e}, "
                f"outside the merged geometry of {ident.n_layers} layers x "
                f"{ident.n_experts} experts ({bad.size} such entries)"
            )


def _shares(tier: WarmTier) -> np.ndarray:
    heat = tier.heat if tier.heat.sum() > 0 else np.linspace(1.0, 1.0 / max(len(tier), 1), len(tier))
    return heat / heat.sum()


def _merge_tier(parts: list[tuple[WarmTier, float]], n_experts: int) -> WarmTier:
    parts = [(t, w) for t, w in parts if len(t)]
    caps = [t.capacity if t.capacity is not None else len(t) for t, _ in parts]
    if not parts:
        return WarmTier.empty(0)
    dense = np.concatenate([t.keys[:, 0] * n_experts + t.keys[:, 1] for t, _ in parts])
    heat = np.concatenate([_shares(t) * w for t, w in parts])
    uniq, inv = np.unique(dense, return_inverse=True)
    total = np.bincount(inv, weights=heat, minlength=len(uniq))
    order = np.argsort(-total, kind="stable")
    keys = np.stack([uniq[order] // n_experts, uniq[order] % n_experts], axis=1).astype(np.int64)
    return WarmTier(keys, total[order], max(caps), ranked=all(t.ranked for t, _ in parts))


def merge(
    files: Sequence[WarmFile], half_life_s: float | None = None, identity: PackIdentity | None = None
) -> WarmFile:
    """Combine warm files of the same pack into one poolmon-shaped WarmFile.
    Raises FormatError naming the first file whose identity or geometry
    disagrees with the others (or with ``identity``)."""
    if not files:
        raise FormatError("merge: no input files")
    ident = _merged_identity(files, identity)
    if ident is None:
        raise FormatError(
            f"{files[0].path}: no input carries a pack identity (all arena heat files); give --pack"
        )
    for wf in files:
        check_range(wf, ident)
    newest = max(wf.wall_time for wf in files)
    weights = [
        1.0 if not half_life_s else 0.5 ** (max(newest - wf.wall_time, 0.0) / half_life_s) for wf in files
    ]
    pool = _merge_tier([(wf.pool, w) for wf, w in zip(files, weights)], ident.n_experts)
    arena = _merge_tier([(wf.arena, w) for wf, w in zip(files, weights)], ident.n_experts)
    counters = PoolmonCounters(
        **{
            tier: TierCounters(
                **{
                    name: sum(getattr(getattr(wf.counters, tier), name) for wf in files)
                    for name in TierCounters.__struct_fields__
                }
            )
            for tier in ("pool", "arena")
        }
    )
    policies = sorted({wf.policy for wf in files if wf.policy})
    return WarmFile(
        path="<merged>",
        kind="poolmon",
        identity=ident,
        pool=pool,
        arena=arena,
        counters=counters,
        wall_time=newest,
        steps=sum(int(wf.steps or 0) for wf in files),
        policy="+".join(policies),
    )


def _tier_summary(tier: WarmTier, n_layers: int | None, top_n: int) -> dict:
    n = len(tier)
    out = {"entries": n, "capacity": tier.capacity, "ranked": tier.ranked}
    if not n:
        return out
    # Count per layer by the layers present (np.unique), not a bincount as long as the
    # largest layer id: a hint naming layer 2e8 must not cost gigabytes.
    ids, counts = np.unique(tier.keys[:, 0], return_counts=True)
    width = int(n_layers) if n_layers else (int(ids[-1]) + 1 if ids.size and ids[-1] < 1 << 16 else 0)
    layers = np.zeros(width, dtype=np.int64)
    inside = ids < width
    layers[ids[inside]] = counts[inside]
    heat = np.sort(tier.heat)[::-1]
    total = float(heat.sum()) or 1.0
    n10 = max(1, int(np.ceil(0.10 * n)))
    out.update(
        {
            "per_layer": layers.tolist(),
            "top10pct_entries": n10,
            "top10pct_share": float(heat[:n10].sum() / total),
            "top_n": min(top_n, n),
            "top_n_share": float(heat[:top_n].sum() / total),
            "hottest": [
                [int(l), int(e), float(h)]
                for (l, e), h in zip(tier.keys[:5].tolist(), tier.heat[:5].tolist())
            ],
        }
    )
    return out


def summarize(wf: WarmFile, top_n: int = TOP_N) -> dict:
    """A JSON-able summary for ``tierstore warm inspect``: identity, per tier the
    entries per layer and heat concentration, and entries a pack would drop."""
    ident = wf.identity
    problems: dict = {}
    if ident is not None:
        for label, tier in (("pool", wf.pool), ("arena", wf.arena)):
            fit_tier(tier, ident.n_layers, ident.n_experts, None, problems, label)
    else:
        big = max([int(t.keys[:, 1].max()) + 1 for t in (wf.pool, wf.arena) if len(t)] or [1])
        for label, tier in (("pool", wf.pool), ("arena", wf.arena)):
            fit_tier(tier, 1 << 62, big, None, problems, label)
    n_layers = ident.n_layers if ident is not None else None
    return {
        "file": wf.path,
        "kind": wf.kind,
        "identity": None if ident is None else {f: getattr(ident, f) for f in ident.__struct_fields__},
        "wall_time": wf.wall_time,
        "steps": wf.steps,
        "policy": wf.policy,
        "counters": {
            t: {n: getattr(getattr(wf.counters, t), n) for n in TierCounters.__struct_fields__}
            for t in ("pool", "arena")
        }
        if wf.kind == "poolmon"
        else None,
        "tiers": {
            "pool": _tier_summary(wf.pool, n_layers, top_n),
            "arena": _tier_summary(wf.arena, n_layers, top_n),
        },
        "problems": problems,
    }


def with_path(wf: WarmFile, path: str) -> WarmFile:
    return replace(wf, path=path)

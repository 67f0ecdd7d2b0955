"""`tierstore warm inspect | merge | convert`: tools on warm-start files.

Every input is read strictly (a file the store would ignore with a warning is
an error here: one line naming it, exit 1); every output is written atomically.
"""

from __future__ import annotations

import datetime as _dt
import json

from tierstore.cli.args import existing_file, existing_path, int_in, output_file, positive_float


def _identity_from_pack(path):
    if path is None:
        return None
    from tierstore.format.pack import Pack
    from tierstore.warm.formats import PackIdentity

    return PackIdentity.of_pack(Pack.open(path))


def _fmt_time(t: float) -> str:
    if not t:
        return "unknown"
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _print_summary(s: dict) -> None:
    print(f"{s['file']}: {s['kind']}")
    ident = s["identity"]
    if ident:
        extra = "".join(
            f", {k} {ident[k]}" for k in ("stride", "ckpt_id", "key20") if ident.get(k) is not None
        )
        print(
            f"  pack: tag {ident['tag']}, {ident['n_layers']} layers x {ident['n_experts']} "
            f"experts, slot_bytes {ident['slot_bytes']}{extra}"
        )
    else:
        print("  pack: no identity in file (arena heat)")
    print(
        f"  written: {_fmt_time(s['wall_time'])}"
        + (f", steps {s['steps']}" if s["steps"] is not None else "")
        + (f", policy {s['policy']}" if s["policy"] else "")
    )
    for tier, t in s["tiers"].items():
        if not t["entries"]:
            continue
        cap = f" of capacity {t['capacity']}" if t["capacity"] else ""
        kind = "rank heat (no scores in file)" if t["ranked"] else "measured heat"
        print(f"  {tier}: {t['entries']} entries{cap}, {kind}")
        print(
            f"    heat share: top 10% ({t['top10pct_entries']} entries) "
            f"{t['top10pct_share']:.1%}, top {t['top_n']} {t['top_n_share']:.1%}"
        )
        print(f"    entries per layer: {' '.join(str(n) for n in t['per_layer'])}")
        print("    hottest: " + ", ".join(f"L{l}/E{e} ({h:.3g})" for l, e, h in t["hottest"]))
    if s["counters"]:
        for tier, c in s["counters"].items():
            if any(c.values()):
                print(f"  {tier} counters: " + ", ".join(f"{k} {v}" for k, v in c.items()))
    if s["problems"]:
        print("  a pack would drop: " + ", ".join(f"{n} {r}" for r, n in s["problems"].items()))
    against = s.get("against_pack")
    if against:
        if against["usable"]:
            dropped = ", ".join(f"{n} {r}" for r, n in against["dropped"].items()) or "nothing"
            print(
                f"  against {against['pack']}: usable, {against['pool_entries']} pool and "
                f"{against['arena_entries']} arena entries (drops {dropped})"
            )
        else:
            print(f"  against {against['pack']}: NOT usable, a store would start cold: {against['reason']}")


def _against_pack(wf, pack_path) -> dict:
    """What a store on ``pack_path`` would do with ``wf``: use it (dropping
    what it lists) or start cold, and why."""
    from tierstore.errors import FormatError
    from tierstore.format.pack import Pack
    from tierstore.warm.validate import fit_to_pack

    with Pack.open(pack_path) as pack:
        try:
            fitted = fit_to_pack(wf, pack)
        except FormatError as exc:
            return {"pack": pack.path, "usable": False, "reason": str(exc), "dropped": {}}
    return {
        "pack": pack.path,
        "usable": True,
        "reason": "",
        "dropped": fitted.skipped,
        "pool_entries": len(fitted.pool),
        "arena_entries": len(fitted.arena),
    }


def _inspect(args) -> int:
    from tierstore.warm.formats import read_warm_file
    from tierstore.warm.tools import summarize

    wf = read_warm_file(args.file)
    summary = summarize(wf, top_n=args.top)
    if args.pack:
        summary["against_pack"] = _against_pack(wf, args.pack)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print_summary(summary)
    return 0


def _merge(args) -> int:
    from tierstore.warm import write_warm_file
    from tierstore.warm.formats import read_warm_file
    from tierstore.warm.tools import merge

    ident = _identity_from_pack(args.pack)
    merged = merge([read_warm_file(p) for p in args.files], args.half_life_s, ident)
    write_warm_file(merged, args.output, args.to, ident)
    print(
        f"{args.output}: {args.to} merged from {len(args.files)} files: "
        f"{len(merged.pool)} pool, {len(merged.arena)} arena entries"
    )
    return 0


def _convert(args) -> int:
    from tierstore.warm import write_warm_file
    from tierstore.warm.formats import read_warm_file
    from tierstore.warm.tools import check_range
    from tierstore.warm.validate import check_identity

    wf = read_warm_file(args.file)
    ident = _identity_from_pack(args.pack)
    if ident is not None:
        check_identity(wf, ident, what=f"pack ({args.pack})")
        if wf.identity is not None:  # keep what the file knows, add what the pack knows
            ident = type(ident)(
                **{
                    f: getattr(wf.identity, f) if getattr(wf.identity, f) is not None else getattr(ident, f)
                    for f in ident.__struct_fields__
                }
            )
    if ident is None:
        ident = wf.identity
    if ident is not None:
        check_range(wf, ident)  # refuse what merge refuses: never copy an unusable entry
    write_warm_file(wf, args.output, args.to, ident)
    print(f"{args.output}: {args.to} from {wf.kind} {args.file}")
    return 0


def register(sub) -> None:
    warm_file = existing_file("warm-start file")
    pack_path = existing_path("pack file or directory")
    kinds = ("poolmon", "pool-heat", "arena-heat")
    p = sub.add_parser(
        "inspect",
        help="Summarise a poolmon, pool-heat-v1 or arena heat file",
        description="Summarise a warm-start file: pack identity, entries per "
        "layer, heat concentration, entries a pack would drop.",
    )
    p.add_argument("file", type=warm_file, help="the warm-start file")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--top", type=int_in(1, 1 << 24), default=64, help="N for the top-N heat share")
    p.add_argument(
        "--pack",
        default=None,
        type=pack_path,
        help="also check the file against this pack (identity, written layers; default: none)",
    )
    p.set_defaults(func=_inspect)

    m = sub.add_parser(
        "merge",
        help="Merge heat from several runs, decayed by age",
        description="Merge warm files of one pack into a poolmon. Heat is "
        "turned into shares per file, weighted by 0.5**(age / "
        "half-life) and summed; pool-heat files count by rank.",
    )
    m.add_argument("files", nargs="+", metavar="FILE", type=warm_file, help="warm-start files")
    m.add_argument(
        "-o",
        "--output",
        required=True,
        type=output_file("warm-start file"),
        help="file to write (atomically)",
    )
    m.add_argument(
        "--half-life-s",
        type=positive_float,
        default=None,
        help="age half-life in seconds (default: no decay)",
    )
    m.add_argument("--to", choices=kinds, default="poolmon", help="output format")
    m.add_argument(
        "--pack",
        default=None,
        type=pack_path,
        help="pack whose identity the inputs must match (default: none)",
    )
    m.set_defaults(func=_merge)

    c = sub.add_parser(
        "convert",
        help="Convert between poolmon, pool-heat-v1 and arena heat",
        description="Convert a warm file. pool-heat and arena heat carry no "
        "scores (rank heat is used); arena heat carries no identity "
        "(give --pack). Entries outside the pack's geometry are "
        "refused, as merge refuses them.",
    )
    c.add_argument("file", type=warm_file, help="the warm-start file")
    c.add_argument(
        "-o",
        "--output",
        required=True,
        type=output_file("warm-start file"),
        help="file to write (atomically)",
    )
    c.add_argument("--to", choices=kinds, required=True, help="output format")
    c.add_argument(
        "--pack",
        default=None,
        type=pack_path,
        help="pack to take (and check) identity from (default: the file's own)",
    )
    c.set_defaults(func=_convert)

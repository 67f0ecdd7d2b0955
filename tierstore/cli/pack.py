"""`tierstore pack build | inspect | verify`.

build prints the path written (stdout, one line) so it composes:
``tierstore pack verify "$(tierstore pack build --synthetic 4,16,65536 out/)"``.
Errors are tierstore exceptions; cli.py prints them as one line and exits 1.
"""
from __future__ import annotations

import json
import os
import sys

from tierstore.errors import ConfigError

_FORMAT_OF_TAG = {"fp4": "mxfp4", "delta": "mxfp4", "base": "base2"}


def register(sub) -> None:
    b = sub.add_parser("build", help="write a pack (synthetic or from safetensors)",
                       description="Write a pack into OUT (a directory, or a .pack path).")
    b.add_argument("out", metavar="OUT")
    src = b.add_mutually_exclusive_group(required=True)
    src.add_argument("--synthetic", metavar="L,E,SLOT",
                     help="L layers x E experts of SLOT bytes of quantised Student-t weights")
    src.add_argument("--from-safetensors", metavar="DIR", dest="from_safetensors",
                     help="directory of .safetensors expert weights")
    b.add_argument("--format", choices=["mxfp4", "nvfp4"], default=None,
                   help="source number format (default: mxfp4 for synthetic, detected for "
                        "safetensors); packs always store MXFP4")
    b.add_argument("--tag", default="fp4", help="row tag: fp4 (default), delta, base")
    b.add_argument("--order", choices=["linear", "fragmajor"], default="linear",
                   help="nibble order of the e2m1 planes (default linear)")
    b.add_argument("--seed", type=int, default=0, help="synthetic weights seed")
    b.add_argument("--ckpt-id", dest="ckpt_id", default=None,
                   help="checkpoint id for the identity (default: hash of the safetensors files)")
    b.set_defaults(func=cmd_build)

    i = sub.add_parser("inspect", help="geometry, layers, layout, identity of a pack")
    i.add_argument("path", metavar="PATH", help="a .pack/.json file or a directory")
    i.add_argument("--tag", default=None, help="with a directory: which tag")
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.set_defaults(func=cmd_inspect)

    v = sub.add_parser("verify", help="check every written row against its checksum")
    v.add_argument("path", metavar="PATH", help="a .pack/.json file or a directory")
    v.add_argument("--tag", default=None, help="with a directory: which tag")
    v.set_defaults(func=cmd_verify)


def _parse_synthetic(text: str) -> tuple[int, int, int]:
    try:
        L, E, slot = (int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"--synthetic {text!r}: expected three integers L,E,SLOT") from None
    return L, E, slot


def _layer_progress(label: str):
    """A rich bar on a terminal; nothing otherwise. Returns (callback, stop)."""
    if not sys.stderr.isatty():
        return None, lambda: None
    from rich.progress import Progress
    p = Progress(transient=True)
    task = p.add_task(label, total=None)
    p.start()
    return (lambda done, total: p.update(task, completed=done, total=total)), p.stop


def cmd_build(args) -> int:
    from tierstore.format.pack import Pack
    on_layer, stop = _layer_progress(f"build {args.out}")
    try:
        if args.synthetic:
            from tierstore.format.build import build_synthetic
            L, E, slot = _parse_synthetic(args.synthetic)
            path, layout = build_synthetic(args.out, L, E, slot, tag=args.tag,
                                           fmt=args.format or "mxfp4", order=args.order,
                                           seed=args.seed, on_layer=on_layer)
        else:
            from tierstore.format.from_safetensors import build_from_safetensors
            path, layout = build_from_safetensors(args.out, args.from_safetensors, tag=args.tag,
                                                  fmt=args.format, order=args.order,
                                                  ckpt_id=args.ckpt_id, on_layer=on_layer)
    finally:
        stop()
    with Pack.open(path) as p:
        print(f"{p.tag}: {p.n_layers} layers x {p.n_experts} experts x {p.slot_bytes} B, "
              f"layout {_layout_summary(p.layout)}", file=sys.stderr)
    print(path)
    return 0


def _layout_summary(layout) -> str:
    if layout is None:
        return "none recorded (opaque rows)"
    if layout.kind == "opaque":
        return (f"opaque: no (H, I) fits this slot size; {layout.params['blocks']} "
                "MXFP4 blocks per row (nibbles, then e8m0 scales)")
    params = ", ".join(f"{k}={v}" for k, v in layout.params.items())
    return f"{layout.kind} {layout.order} ({params})"


def inspect_dict(p) -> dict:
    """What `pack inspect --json` prints; FORMAT.md lists the keys."""
    import msgspec
    ours = p.checksum_algo is not None or p.layout is not None
    if p.layout is not None:
        codecs = {s.codec.split(".")[0] for s in p.layout.sections}
        fmt = "base2" if "base2" in codecs else "mxfp4" if "e2m1" in codecs else "opaque"
    else:
        fmt = _FORMAT_OF_TAG.get(p.tag, "opaque")
    return {
        "path": p.path, "sidecar": p.sidecar_path,
        "container": "tierstore" if ours else "vllm-moet",
        "name_style": "v2" if p.name.key20 else "old",
        "format": fmt,
        "tag": p.tag, "n_layers": p.n_layers, "n_experts": p.n_experts,
        "slot_bytes": p.slot_bytes, "stride": p.stride, "file_bytes": p.file_bytes,
        "layers": list(p.layers), "layers_written": len(p.layers),
        "rank": p.name.rank, "world": p.name.world,
        "pp": list(p.name.pp) if p.name.pp else None,
        "identity": p.identity, "key20": p.key20, "key20_in_name": p.name.key20,
        "layout": msgspec.to_builtins(p.layout) if p.layout is not None else None,
        "layout_note": _layout_summary(p.layout),
        "checksum": p.checksum_algo, "unknown_fields": p.unknown_fields,
    }


def cmd_inspect(args) -> int:
    from tierstore.format.pack import Pack
    with Pack.open(args.path, tag=args.tag) as p:
        d = inspect_dict(p)
    if args.json:
        print(json.dumps(d, indent=2))
        return 0
    lay = d["layout"]
    lines = [
        f"{os.path.basename(d['path'])}  ({d['container']} sidecar, {d['name_style']} name)",
        f"  tag {d['tag']}   format {d['format']}",
        f"  geometry {d['n_layers']} layers x {d['n_experts']} experts, slot {d['slot_bytes']} B, "
        f"stride {d['stride']} B, file {d['file_bytes']} B",
        f"  layers written {d['layers_written']}/{d['n_layers']}: {_ranges(d['layers'])}",
        f"  identity key20 {d['key20']}  ckpt_id {d['identity']['ckpt_id']}  "
        f"quantizer_abi {d['identity']['quantizer_abi']}  zero_mode {d['identity']['zero_mode']}",
        f"  rank {d['rank']} of {d['world']}" + (f", pp {d['pp'][0]} of {d['pp'][1]}" if d["pp"] else ""),
        f"  checksum {d['checksum'] or 'none recorded'}",
        f"  layout {d['layout_note']}",
    ]
    for s in (lay or {}).get("sections", []):
        lines.append(f"    {s['name']:<10} @{s['offset']:>10}  {s['bytes']:>10} B  "
                     f"{s['dtype']} {s['shape']}  {s['codec']}")
    print("\n".join(lines))
    return 0


def _ranges(layers: list[int]) -> str:
    if not layers:
        return "none"
    out, start = [], layers[0]
    for a, b in zip(layers, layers[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ",".join(out)


def cmd_verify(args) -> int:
    from tierstore.format.pack import Pack
    with Pack.open(args.path, tag=args.tag) as p:
        report = p.verify(progress=sys.stderr.isatty())
        name = os.path.basename(p.path)
    if report.rows_unchecked:
        print(f"{name}: no checksums recorded; {report.rows_unchecked} written rows are "
              "readable but unverified")
    else:
        print(f"{name}: ok, {report.rows_checked} rows ({report.bytes_checked} B) match "
              "their xxh3_64 checksums")
    return 0

"""`tierstore pack build | inspect | verify`.

build prints the path written (stdout, one line) so it composes:
``tierstore pack verify "$(tierstore pack build --synthetic 4,16,65536 out/)"``.
Errors are tierstore exceptions; cli.py prints them as one line and exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

from tierstore.cli.args import existing_dir, existing_path, non_negative_int, output_dir, output_file, say
from tierstore.errors import ConfigError

_FORMAT_OF_TAG = {"fp4": "mxfp4", "delta": "mxfp4", "base": "base2"}


def register(sub) -> None:
    b = sub.add_parser(
        "build",
        help="write a pack (synthetic or from safetensors)",
        description="Write a pack into OUT (a directory, or a .pack path). "
        "An interrupted or failed fresh build removes what it "
        "wrote; a build that resumes an existing pack keeps it.",
    )
    b.add_argument(
        "out", metavar="OUT", type=pack_out, help="output directory (created if missing) or a .pack file path"
    )
    src = b.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--synthetic",
        metavar="L,E,SLOT",
        type=synthetic_geometry,
        help="L layers x E experts of SLOT bytes of quantised Student-t weights",
    )
    src.add_argument(
        "--from-safetensors",
        metavar="DIR",
        dest="from_safetensors",
        type=existing_dir("directory of .safetensors files"),
        help="directory of .safetensors expert weights",
    )
    b.add_argument(
        "--format",
        choices=["mxfp4", "nvfp4"],
        default=None,
        help="source number format (default: mxfp4 for synthetic, detected for "
        "safetensors); packs always store MXFP4",
    )
    b.add_argument(
        "--tag", default="fp4", type=tag_name, help="row tag: fp4, delta, base or any [A-Za-z0-9_-]+ name"
    )
    b.add_argument(
        "--order", choices=["linear", "fragmajor"], default="linear", help="nibble order of the e2m1 planes"
    )
    b.add_argument("--seed", type=non_negative_int, default=0, help="synthetic weights seed")
    b.add_argument(
        "--ckpt-id",
        dest="ckpt_id",
        default=None,
        type=_ckpt_id,
        help="checkpoint id for the identity, with --from-safetensors (default: "
        "hash of the safetensors files)",
    )
    b.set_defaults(func=cmd_build)

    i = sub.add_parser("inspect", help="geometry, layers, layout, identity of a pack")
    i.add_argument(
        "path",
        metavar="PATH",
        type=existing_path("pack file or directory"),
        help="a .pack/.json file or a directory",
    )
    i.add_argument(
        "--tag", default=None, type=tag_name, help="with a directory: which tag (default: the only one)"
    )
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.set_defaults(func=cmd_inspect)

    v = sub.add_parser("verify", help="check every written row against its checksum")
    v.add_argument(
        "path",
        metavar="PATH",
        type=existing_path("pack file or directory"),
        help="a .pack/.json file or a directory",
    )
    v.add_argument(
        "--tag", default=None, type=tag_name, help="with a directory: which tag (default: the only one)"
    )
    v.set_defaults(func=cmd_verify)


MAX_SLOT_BYTES = 1 << 30


def synthetic_geometry(text: str) -> tuple[int, int, int]:
    """``L,E,SLOT``: three positive integers (SLOT at most 1 GiB)."""
    parts = str(text).split(",")
    try:
        L, E, slot = (int(x, 10) for x in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected three integers L,E,SLOT (layers, experts, slot bytes), found {text!r}"
        ) from None
    if min(L, E, slot) < 1 or slot > MAX_SLOT_BYTES or L * E > 1 << 24:
        raise argparse.ArgumentTypeError(
            f"expected L,E,SLOT >= 1 with SLOT <= {MAX_SLOT_BYTES} and L*E <= {1 << 24}, found {text!r}"
        )
    return L, E, slot


def tag_name(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_-]+", str(text)):
        raise argparse.ArgumentTypeError(f"expected a tag of [A-Za-z0-9_-]+, found {text!r}")
    return str(text)


def pack_out(text: str) -> str:
    """OUT of pack build: a .pack file path or a directory (either may not exist yet;
    the nearest existing ancestor must be a writable directory)."""
    if str(text).endswith(".pack"):
        return (
            output_file("pack file")(text)
            if os.path.isdir(os.path.dirname(os.path.abspath(text)))
            else output_dir("pack file's directory")(text)
        )
    return output_dir("pack directory")(text)


def _layer_progress(label: str):
    """A rich bar on a terminal; plain lines (at most one every 5 s, and the last) in a
    log or pipe. Returns (callback, stop)."""
    if not sys.stderr.isatty():
        last = [0.0]

        def line(done, total):
            now = time.monotonic()
            if done == total or now - last[0] >= 5.0:
                last[0] = now
                say(f"{label}: layer {done}/{total}")

        return line, lambda: None
    from rich.progress import Progress

    p = Progress(transient=True)
    task = p.add_task(label, total=None)
    p.start()
    return (lambda done, total: p.update(task, completed=done, total=total)), p.stop


def _ckpt_id(text: str) -> str:
    """A checkpoint id: printable, non-empty (it is part of the identity and printed)."""
    if not text or not text.isprintable() or len(text) > 4096:
        raise argparse.ArgumentTypeError(
            f"expected a non-empty printable id of at most 4096 characters, found {text[:80]!r}"
        )
    return text


def cmd_build(args) -> int:
    from tierstore.format.pack import Pack

    if args.synthetic and args.ckpt_id is not None:
        # a synthetic pack's identity is its geometry and seed; an id given here was
        # silently dropped, so the pack did not carry what the user asked for
        raise ConfigError(
            "--ckpt-id applies to --from-safetensors only; a --synthetic "
            "pack's checkpoint id is derived from --seed"
        )
    on_layer, stop = _layer_progress(f"build {args.out}")
    # The writer owns what it creates: failed or interrupted, it removes exactly that (a
    # fresh pack, its sidecar, lock and new directories), never a file another build made
    # or finished beside it meanwhile; a pack it resumed stays, plus the layers written.
    # It also asks for the free space the layers still to write need, before writing.
    owned = dict(on_layer=on_layer, discard_on_error=True, check_space=True)
    try:
        if args.synthetic:
            from tierstore.format.build import build_synthetic

            L, E, slot = args.synthetic
            path, layout = build_synthetic(
                args.out,
                L,
                E,
                slot,
                tag=args.tag,
                fmt=args.format or "mxfp4",
                order=args.order,
                seed=args.seed,
                **owned,
            )
        else:
            from tierstore.format.from_safetensors import build_from_safetensors

            path, layout = build_from_safetensors(
                args.out,
                args.from_safetensors,
                tag=args.tag,
                fmt=args.format,
                order=args.order,
                ckpt_id=args.ckpt_id,
                **owned,
            )
    finally:
        stop()
    with Pack.open(path) as p:
        print(
            f"{p.tag}: {p.n_layers} layers x {p.n_experts} experts x {p.slot_bytes} B, "
            f"layout {_layout_summary(p.layout)}",
            file=sys.stderr,
        )
    print(path)
    return 0


def _layout_summary(layout) -> str:
    if layout is None:
        return "none recorded (opaque rows)"
    if layout.kind == "opaque":
        return (
            f"opaque: no (H, I) fits this slot size; {layout.params['blocks']} "
            "MXFP4 blocks per row (nibbles, then e8m0 scales)"
        )
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
        "path": p.path,
        "sidecar": p.sidecar_path,
        "container": "tierstore" if ours else "vllm-moet",
        "name_style": "v2" if p.name.key20 else "old",
        "format": fmt,
        "tag": p.tag,
        "n_layers": p.n_layers,
        "n_experts": p.n_experts,
        "slot_bytes": p.slot_bytes,
        "stride": p.stride,
        "file_bytes": p.file_bytes,
        "layers": list(p.layers),
        "layers_written": len(p.layers),
        "rank": p.name.rank,
        "world": p.name.world,
        "pp": list(p.name.pp) if p.name.pp else None,
        "identity": p.identity,
        "key20": p.key20,
        "key20_in_name": p.name.key20,
        "layout": msgspec.to_builtins(p.layout) if p.layout is not None else None,
        "layout_note": _layout_summary(p.layout),
        "checksum": p.checksum_algo,
        "unknown_fields": p.unknown_fields,
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
        lines.append(
            f"    {s['name']:<10} @{s['offset']:>10}  {s['bytes']:>10} B  "
            f"{s['dtype']} {s['shape']}  {s['codec']}"
        )
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
        print(
            f"{name}: no checksums recorded; {report.rows_unchecked} written rows are readable but unverified"
        )
    else:
        print(
            f"{name}: ok, {report.rows_checked} rows ({report.bytes_checked} B) match their xxh3_64 checksums"
        )
    return 0

"""Hostile command lines for the hostile suite: every ``tierstore`` subcommand with bad
arguments, bad numbers (nan, inf, negative, huge), conflicting flags and hostile
paths (missing, a directory, a FIFO, a character device, a dangling symlink, a
symlink loop, a path through a file, empty, garbage, truncated, deeply nested,
sparse-huge files, outputs that exist as a directory or cannot be created).

``make_place`` builds the scratch tree once; ``cli_cases`` gives (name, argv, names)
where ``names`` are the strings the one stderr line must contain (the file or the
option). The runner (test_cli.py) checks the rest: a non-zero exit, one line, no
traceback, bounded time, nothing on disk changed."""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field

import numpy as np

from tierstore.testing.packs import make_random_pack

HUGE = 1 << 40  # sparse files: one TiB that costs no disk


@dataclass
class Place:
    root: str
    pack: str = ""  # a good pack file
    warm: str = ""  # a good poolmon
    trace: str = ""  # a good trace
    p: dict = field(default_factory=dict)  # kind -> a hostile path

    def __getitem__(self, kind: str) -> str:
        return self.p[kind]


def _write(path: str, data: bytes) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return path


def _sparse(path: str, size: int = HUGE, head: bytes = b"") -> str:
    _write(path, head)
    os.truncate(path, size)
    return path


def _pack_dir_with(
    root: str, name: str, good_pack: str, pack_bytes=None, sidecar=None, fifo: str | None = None
) -> str:
    """A copy of the good pack's directory with its .pack or .json replaced."""
    d = os.path.join(root, name)
    os.makedirs(d)
    base = os.path.basename(good_pack)
    with open(good_pack, "rb") as f:
        data = f.read()
    with open(good_pack[:-5] + ".json", "rb") as f:
        side = f.read()
    target_pack, target_side = os.path.join(d, base), os.path.join(d, base[:-5] + ".json")
    for target, default, replacement, kind in (
        (target_pack, data, pack_bytes, "pack"),
        (target_side, side, sidecar, "json"),
    ):
        if fifo == kind:
            os.mkfifo(target)
        elif callable(replacement):
            replacement(target)
        else:
            _write(target, default if replacement is None else replacement)
    return d


def make_place(root: str) -> Place:
    import tierstore as ts

    pl = Place(root)
    pack = make_random_pack(os.path.join(root, "packs"), 2, 4, 4096, seed=0)
    pl.pack = pack.path
    with ts.ExpertStore(pack, vram_slots=4, device="cpu") as store:
        store.release(store.fire([(0, 1), (1, 2)]))
        store.step()
        pl.warm = os.path.join(root, "warm.poolmon.json")
        store.save_poolmon(pl.warm)
    pack.close()
    pl.trace = os.path.join(root, "trace.npy")
    np.save(pl.trace, np.array([[0, 0, 1], [0, 1, 2], [1, 0, 3]], np.int32))
    P = pl.p
    P["missing"] = os.path.join(root, "nope", "nope.json")
    P["dir"] = os.path.join(root, "adir")
    os.makedirs(P["dir"])
    P["fifo"] = os.path.join(root, "a.fifo")
    os.mkfifo(P["fifo"])
    P["chardev"] = "/dev/zero"
    P["dangling"] = os.path.join(root, "dangling.json")
    os.symlink(os.path.join(root, "gone"), P["dangling"])
    P["loop"] = os.path.join(root, "loop.json")
    os.symlink(P["loop"], P["loop"])
    P["text"] = _write(os.path.join(root, "afile"), b"not what you think\n")
    P["through_file"] = os.path.join(P["text"], "x.json")
    P["empty"] = _write(os.path.join(root, "empty.json"), b"")
    P["garbage"] = _write(
        os.path.join(root, "garbage.bin"), np.random.default_rng(1).integers(0, 256, 4096, np.uint8).tobytes()
    )
    P["huge"] = _sparse(os.path.join(root, "huge.json"), head=b'{"version": 1, "keys": [')
    P["deep"] = _write(os.path.join(root, "deep.json"), b"[" * 200_000 + b"]" * 200_000)
    with open(pl.warm, "rb") as f:
        warm = f.read()
    P["warm_cut"] = _write(os.path.join(root, "cut.poolmon.json"), warm[: len(warm) // 2])
    P["warm_nul"] = _write(os.path.join(root, "nul.poolmon.json"), b"\0" * 512)
    P["warm_nan"] = _write(
        os.path.join(root, "nan.poolmon.json"), warm.replace(b'"wall_time":', b'"wall_time":NaN,"x":', 1)
    )
    # traces
    P["npy_text"] = _write(os.path.join(root, "text.npy"), b"hello\n")
    P["npy_empty"] = _write(os.path.join(root, "empty.npy"), b"")
    P["npy_huge"] = _sparse(os.path.join(root, "huge.npy"), head=_npy_header((1 << 36, 3)))
    P["npy_cut"] = _write(os.path.join(root, "cut.npy"), open(pl.trace, "rb").read()[:-7])
    P["npy_float"] = os.path.join(root, "float.npy")
    np.save(P["npy_float"], np.ones((4, 3), np.float64))
    P["npy_shape"] = os.path.join(root, "shape.npy")
    np.save(P["npy_shape"], np.ones((4, 5), np.int32))
    P["npy_object"] = _write(os.path.join(root, "object.npy"), _npy_header((2, 3), "|O") + b"\x80\x04N.")
    # an expert id that would size the replay's per-key state at 2**31 keys
    P["npy_expert_huge"] = os.path.join(root, "expert_huge.npy")
    np.save(P["npy_expert_huge"], np.array([[0, 0, 1], [0, 1, (1 << 31) - 1]], np.int32))
    # a good trace beside a .meta.json of hostile values (named as the error must name it)
    for kind, meta in (
        ("str", {"num_experts": "abc"}),
        ("list", {"num_experts": [1]}),
        ("bool", {"num_experts": True}),
        ("float", {"num_experts": 1e12}),
        ("huge", {"num_experts": 1 << 40}),
        ("neg", {"num_experts": -5}),
        ("layers", {"layers_present": 5}),
        ("name", {"name": 5}),
        ("topk", {"top_k": 0}),
    ):
        d = os.path.join(root, f"meta-{kind}")
        os.makedirs(d)
        np.save(os.path.join(d, "t.npy"), np.array([[0, 0, 1], [1, 0, 3]], np.int32))
        P[f"npy_meta_{kind}"] = os.path.join(d, "t.npy")
        P[f"meta_{kind}"] = _write(os.path.join(d, "t.meta.json"), json.dumps(meta).encode())
    # packs
    side = json.load(open(pl.pack[:-5] + ".json"))
    P["pack_cut"] = _pack_dir_with(root, "pk-cut", pl.pack, pack_bytes=open(pl.pack, "rb").read()[:5000])
    P["pack_fifo"] = _pack_dir_with(root, "pk-fifo", pl.pack, fifo="pack")
    P["side_fifo"] = _pack_dir_with(root, "pk-sfifo", pl.pack, fifo="json")
    P["side_garbage"] = _pack_dir_with(root, "pk-sgarb", pl.pack, sidecar=b"\xff\xfe{[" * 100)
    P["side_deep"] = _pack_dir_with(root, "pk-sdeep", pl.pack, sidecar=b"[" * 100_000 + b"]" * 100_000)
    P["side_huge"] = _pack_dir_with(
        root, "pk-shuge", pl.pack, sidecar=lambda t: _sparse(t, head=b'{"version": 2, "tag": "')
    )
    P["pack_huge"] = _pack_dir_with(root, "pk-phuge", pl.pack, pack_bytes=lambda t: _sparse(t))
    P["side_keys"] = _pack_dir_with(
        root, "pk-skeys", pl.pack, sidecar=json.dumps({**side, "E": 1 << 30, "n_layers": 1 << 30}).encode()
    )
    P["side_empty"] = _pack_dir_with(root, "pk-sempty", pl.pack, sidecar=b"")
    P["no_pack_dir"] = os.path.join(root, "adir")
    # files of the wrong kind: a sidecar, a pack, a trace or a poolmon where another is
    # expected; a sidecar whose pack is gone; .json names that are a FIFO or text; a file
    # no one may read (root reads it anyway: test_cli.py denies it to root by hand)
    P["sidecar"], P["pack"] = pl.pack[:-5] + ".json", pl.pack
    P["npy"], P["poolmon"] = pl.trace, pl.warm
    P["sidecar_lone"] = _write(
        os.path.join(root, "lone", os.path.basename(P["sidecar"])), open(P["sidecar"], "rb").read()
    )
    P["json_fifo"] = os.path.join(root, "fifo.json")
    os.mkfifo(P["json_fifo"])
    P["json_text"] = _write(os.path.join(root, "text.json"), b"not what you think\n")
    P["noperm"] = _write(os.path.join(root, "noperm.json"), b"{}")
    d = _pack_dir_with(root, "pk-noperm-side", pl.pack)
    P["noperm_side"] = os.path.join(d, os.path.basename(P["sidecar"]))
    d = _pack_dir_with(root, "pk-noperm-pack", pl.pack)
    P["noperm_pack"] = os.path.join(d, os.path.basename(pl.pack))
    for kind in NO_PERMISSION:
        os.chmod(P[kind], 0)
    # safetensors sources
    P["st_garbage"] = os.path.dirname(
        _write(os.path.join(root, "st-garb", "model.safetensors"), b"garbage" * 100)
    )
    P["st_header"] = os.path.dirname(
        _write(os.path.join(root, "st-head", "model.safetensors"), struct.pack("<Q", 1 << 60) + b"{}")
    )
    P["st_fifo"] = os.path.join(root, "st-fifo")
    os.makedirs(P["st_fifo"])
    os.mkfifo(os.path.join(P["st_fifo"], "model.safetensors"))
    P["st_empty"] = os.path.join(root, "st-empty")
    os.makedirs(P["st_empty"])
    # outputs
    P["out_exists_dir"] = P["dir"]
    P["out_proc"] = "/proc/tierstore-x/out.json"
    P["out_through_file"] = os.path.join(P["text"], "out.json")
    return pl


def _npy_header(shape, descr: str = "<i4") -> bytes:
    head = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}".encode()
    head += b" " * (64 - (10 + len(head) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head


# where a pack (or its sidecar, or a directory of packs) is expected
NO_PERMISSION = ("noperm", "noperm_side", "noperm_pack")  # mode 000
WRONG_FOR_PACK = ("sidecar_lone", "poolmon", "json_fifo", "json_text", "npy", *NO_PERMISSION)
BAD_NUMBERS = ("nan", "inf", "-inf", "-1", "1e400", "99999999999999999999", "x", "")


def cli_cases(pl: Place) -> list[tuple[str, list[str], list[str]]]:
    P, out = pl.p, []

    def add(name, argv, *names):
        out.append((name, [str(a) for a in argv], [str(n) for n in names]))

    # -- pack inspect / verify: every hostile input path
    for cmd in ("inspect", "verify"):
        for kind in (
            "missing",
            "fifo",
            "chardev",
            "dangling",
            "loop",
            "text",
            "through_file",
            "empty",
            "garbage",
            "huge",
            "no_pack_dir",
            "pack_cut",
            "pack_fifo",
            "side_fifo",
            "side_garbage",
            "side_deep",
            "side_huge",
            "pack_huge",
            "side_keys",
            "side_empty",
        ):
            # the error names the path the user gave (a .json given: not the .pack it implies)
            add(f"pack-{cmd}-{kind}", ["pack", cmd, P[kind]], P[kind])
        for kind in WRONG_FOR_PACK:
            add(f"pack-{cmd}-{kind}", ["pack", cmd, P[kind]], P[kind])
        add(f"pack-{cmd}-tag", ["pack", cmd, os.path.dirname(pl.pack), "--tag", "a b"], "--tag")
        add(f"pack-{cmd}-tag-absent", ["pack", cmd, os.path.dirname(pl.pack), "--tag", "zz"], "zz")
    # -- pack build
    o = os.path.join(pl.root, "built")
    for kind in ("text", "through_file", "fifo", "chardev", "loop"):
        add(f"pack-build-out-{kind}", ["pack", "build", P[kind], "--synthetic", "2,4,4096"], P[kind])
    add(
        "pack-build-out-proc",
        ["pack", "build", "/proc/tierstore-x", "--synthetic", "2,4,4096"],
        "/proc/tierstore-x",
    )
    for geo in (
        "nan,4,4096",
        "2,inf,4096",
        "2,4,-1",
        "2,4,0",
        "0,4,4096",
        "2,4",
        "2,4,4096,1",
        "1e3,4,4096",
        "99999999999,4,4096",
        "2,4,99999999999999",
        "65536,65536,65536",
    ):
        add(f"pack-build-geo-{geo}", ["pack", "build", o, "--synthetic", geo], "--synthetic")
    add(
        "pack-build-both-sources",
        ["pack", "build", o, "--synthetic", "2,4,4096", "--from-safetensors", P["st_empty"]],
        "--from-safetensors",
    )
    add("pack-build-no-source", ["pack", "build", o], "--synthetic")
    for kind in ("sidecar", "npy"):
        add(f"pack-build-out-{kind}", ["pack", "build", P[kind], "--synthetic", "2,4,4096"], P[kind])
    for kind in (
        "st_garbage",
        "st_header",
        "st_fifo",
        "st_empty",
        "missing",
        "text",
        "fifo",
        "sidecar",
        "pack",
        "npy",
    ):
        add(f"pack-build-st-{kind}", ["pack", "build", o, "--from-safetensors", P[kind]], P[kind])
    for seed in ("nan", "-1", "1e400", "x"):
        add(
            f"pack-build-seed-{seed}",
            ["pack", "build", o, "--synthetic", "2,4,4096", "--seed", seed],
            "--seed",
        )
    add("pack-build-format", ["pack", "build", o, "--synthetic", "2,4,4096", "--format", "fp8"], "--format")
    add("pack-build-order", ["pack", "build", o, "--synthetic", "2,4,4096", "--order", "x"], "--order")
    add("pack-build-tag-slash", ["pack", "build", o, "--synthetic", "2,4,4096", "--tag", "x/y"], "--tag")
    add(
        "pack-build-ckpt-synthetic",
        ["pack", "build", o, "--synthetic", "2,4,4096", "--ckpt-id", "mine"],
        "--ckpt-id",
    )
    add(
        "pack-build-ckpt-newline",
        ["pack", "build", o, "--from-safetensors", P["st_empty"], "--ckpt-id", "a\nb"],
        "--ckpt-id",
    )
    # -- warm inspect / merge / convert
    warm_kinds = (
        "missing",
        "dir",
        "fifo",
        "chardev",
        "dangling",
        "loop",
        "text",
        "through_file",
        "empty",
        "garbage",
        "huge",
        "deep",
        "warm_cut",
        "warm_nul",
        "warm_nan",
    )
    for kind in warm_kinds + ("sidecar", "sidecar_lone", "pack", "npy", "noperm"):
        add(f"warm-inspect-{kind}", ["warm", "inspect", P[kind]], P[kind])
        add(
            f"warm-merge-{kind}",
            ["warm", "merge", pl.warm, P[kind], "-o", os.path.join(pl.root, "m.json")],
            P[kind],
        )
        add(
            f"warm-convert-{kind}",
            ["warm", "convert", P[kind], "--to", "pool-heat", "-o", os.path.join(pl.root, "c.json")],
            P[kind],
        )
    for kind in ("fifo", "dir", "garbage", "pack_cut", "side_keys"):
        add(f"warm-inspect-pack-{kind}", ["warm", "inspect", pl.warm, "--pack", P[kind]], P[kind])
    for kind in WRONG_FOR_PACK:
        m, c = os.path.join(pl.root, "m.json"), os.path.join(pl.root, "c.json")
        for cmd, argv in (
            ("inspect", [pl.warm]),
            ("merge", [pl.warm, "-o", m]),
            ("convert", [pl.warm, "--to", "poolmon", "-o", c]),
        ):
            add(f"warm-{cmd}-pack-{kind}", ["warm", cmd, *argv, "--pack", P[kind]], P[kind])
    for top in ("nan", "inf", "-1", "0", "99999999999999999999"):
        add(f"warm-inspect-top-{top}", ["warm", "inspect", pl.warm, "--top", top], "--top")
    for kind in ("out_exists_dir", "out_proc", "out_through_file", "fifo", "chardev"):
        add(f"warm-merge-out-{kind}", ["warm", "merge", pl.warm, "-o", P[kind]], P[kind])
        add(
            f"warm-convert-out-{kind}",
            ["warm", "convert", pl.warm, "--to", "pool-heat", "-o", P[kind]],
            P[kind],
        )
    for hl in ("nan", "inf", "-inf", "-1", "1e400", "x", "", "0"):
        add(
            f"warm-merge-half-life-{hl}",
            ["warm", "merge", pl.warm, "-o", os.path.join(pl.root, "m.json"), "--half-life-s", hl],
            "--half-life-s",
        )
    add(
        "warm-convert-to",
        ["warm", "convert", pl.warm, "--to", "json", "-o", os.path.join(pl.root, "c.json")],
        "--to",
    )
    add("warm-convert-no-to", ["warm", "convert", pl.warm, "-o", os.path.join(pl.root, "c.json")], "--to")
    add("warm-merge-no-output", ["warm", "merge", pl.warm], "-o")
    add(
        "warm-convert-pack-other",
        [
            "warm",
            "convert",
            pl.warm,
            "--to",
            "poolmon",
            "-o",
            os.path.join(pl.root, "c.json"),
            "--pack",
            P["side_garbage"],
        ],
        P["side_garbage"],
    )
    # -- bench hits
    hits = [
        "bench",
        "hits",
        "--synthetic",
        "--ticks",
        "8",
        "--layers",
        "2",
        "--experts",
        "8",
        "--top-k",
        "2",
        "--prefill-tokens",
        "0",
    ]
    for kind in (
        "missing",
        "dir",
        "fifo",
        "chardev",
        "npy_text",
        "npy_empty",
        "npy_huge",
        "npy_cut",
        "npy_float",
        "npy_shape",
        "npy_object",
        "garbage",
        "loop",
        "sidecar",
        "pack",
        "poolmon",
        "noperm",
        "json_text",
        "empty",
    ):
        add(f"bench-hits-trace-{kind}", ["bench", "hits", "--trace", P[kind]], P[kind])
    add(
        "bench-hits-trace-expert-huge",
        ["bench", "hits", "--trace", P["npy_expert_huge"]],
        P["npy_expert_huge"],
        "row 1",
        "expert 2147483647",
    )
    for kind in ("str", "list", "bool", "float", "huge", "neg", "layers", "name", "topk"):
        add(
            f"bench-hits-trace-meta-{kind}",
            ["bench", "hits", "--trace", P[f"npy_meta_{kind}"]],
            P[f"meta_{kind}"],
        )
    add("bench-hits-key-space", hits + ["--layers", "4096", "--experts", "65536"], "--layers", "--experts")
    add("bench-hits-rows-huge", hits + ["--ticks", "16777216", "--batch", "4096"], "--ticks", "--batch")
    add("bench-hits-prefill-huge", hits + ["--prefill-tokens", "100000000000"], "--prefill-tokens")
    add("bench-hits-both", ["bench", "hits", "--trace", pl.trace, "--synthetic"], "--synthetic")
    for opt in (
        "--budget",
        "--threshold",
        "--ticks-per-second",
        "--half-life",
        "--row-bytes",
        "--ticks",
        "--batch",
        "--layers",
        "--experts",
        "--prefill-every",
    ):
        for bad in ("nan", "-1", "inf"):
            add(f"bench-hits{opt}-{bad}", hits + [opt, bad], opt)
    add("bench-hits-layers-huge", hits + ["--layers", "99999999999"], "--layers")
    add("bench-hits-experts-huge", hits + ["--experts", "99999999999"], "--experts")
    add("bench-hits-slots", hits + ["--slots", "4,nan"], "--slots")
    add("bench-hits-granularity", hits + ["--granularity", "step"], "--granularity")
    for kind in ("out_exists_dir", "out_proc", "out_through_file", "fifo"):
        add(f"bench-hits-plot-{kind}", hits + ["--plot", P[kind]], P[kind])
    # -- bench io
    io = [
        "bench",
        "io",
        "--pack",
        pl.pack,
        "--fires",
        "1",
        "--repeats",
        "1",
        "--no-baselines",
        "--h2d-gb",
        "0.001",
        "--ceiling-gb",
        "0.001",
        "--device",
        "cpu",
    ]
    for kind in ("fifo", "dir", "chardev", "garbage", "loop", "huge", *WRONG_FOR_PACK):
        add(f"bench-io-pack-{kind}", ["bench", "io", "--pack", P[kind], "--device", "cpu"], P[kind])
    for opt in (
        "--create-gb",
        "--threads",
        "--chunk-mib",
        "--stage-count",
        "--cold-repeats",
        "--ceiling-gb",
        "--h2d-gb",
        "--kvikio-threads",
        "--row-bytes",
    ):
        for bad in ("nan", "-1", "inf"):
            add(f"bench-io{opt}-{bad}", io + [opt, bad], opt)
    add(
        "bench-io-create-huge",
        ["bench", "io", "--pack", os.path.join(pl.root, "new.bin"), "--create-gb", "1e9", "--device", "cpu"],
        "GB",
    )
    for kind in ("out_exists_dir", "out_proc", "fifo"):
        add(f"bench-io-out-{kind}", io + ["--out", P[kind]], P[kind])
    # -- bench fire
    fire = ["bench", "fire", "--dir", os.path.join(pl.root, "fire"), "--device", "cpu"]
    for kind in ("text", "fifo", "through_file", "out_proc"):
        add(
            f"bench-fire-dir-{kind}",
            ["bench", "fire", "--dir", P[kind], "--device", "cpu"],
            P[kind] if kind != "out_proc" else "/proc",
        )
    for opt in (
        "--layers",
        "--experts",
        "--row-bytes",
        "--threads",
        "--repeats",
        "--h2d-gb",
        "--step-misses",
        "--layer-ms",
        "--step-groups",
        "--baseline-rows",
    ):
        for bad in ("nan", "-1"):
            add(f"bench-fire{opt}-{bad}", fire + [opt, bad], opt)
    for opt in ("--sizes", "--cold-sizes", "--sources", "--skip"):
        add(f"bench-fire{opt}-garbage", fire + [opt, "x,,nan"], opt)
    for kind in ("out_exists_dir", "out_proc"):
        add(f"bench-fire-out-{kind}", fire + ["--out", P[kind]], P[kind])
        add(f"bench-fire-png-{kind}", fire + ["--png", P[kind]], P[kind])
    # -- demo
    demo = ["demo", "--quick", "--device", "cpu"]
    for opt in ("--steps", "--warm-steps", "--seed", "--warm-seed"):
        for bad in ("nan", "-1", "1e400"):
            add(f"demo{opt}-{bad}", demo + [opt, bad], opt)
    add("demo-rows", demo + ["--rows", "huge"], "--rows")
    for kind in ("text", "fifo", "through_file", "chardev"):
        add(f"demo-out-{kind}", demo + ["--out", P[kind]], P[kind])
    for kind in ("out_exists_dir", "out_proc", "fifo"):
        add(f"demo-plot-{kind}", demo + ["--plot", P[kind]], P[kind])
    add("demo-plot-and-no-plot", demo + ["--plot", os.path.join(pl.root, "d.png"), "--no-plot"], "--no-plot")
    # -- the top level
    add("top-unknown-command", ["frobnicate"], "frobnicate")
    add("top-unknown-sub", ["pack", "frobnicate"], "frobnicate")
    add("top-no-sub", ["warm"], "SUBCOMMAND")
    add("top-unknown-option", ["pack", "inspect", pl.pack, "--frob"], "--frob")
    return out

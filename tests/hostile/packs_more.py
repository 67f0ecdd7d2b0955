"""The rest of the hostile pack corpus: geometry and counts, layout sections, checksums,
the data file (truncated, extended, not a regular file), rows corrupted in place, names
of both styles, directories with several or no candidates, and unknown fields."""

from __future__ import annotations

import json
import os
import socket

from hostile.packs import (
    FILE_BYTES,
    SLOT,
    STRIDE,
    STYLES,
    E,
    L,
    PackCase,
    _side_case,
    data,
    key20,
    pack_name,
    sidecar,
    write_pack,
)


def _set(**kv):
    return lambda s: s.update(kv)


def geometry_cases() -> list[PackCase]:
    out = []
    big = [
        ("E-cap", _set(E=1 << 16)),
        ("E-over-cap", _set(E=(1 << 16) + 1)),
        ("layers-cap", _set(n_layers=1 << 16)),
        ("layers-over-cap", _set(n_layers=(1 << 16) + 1)),
        ("slot-cap", _set(slot_bytes=1 << 36, stride=1 << 36)),
        ("slot-over-cap", _set(slot_bytes=(1 << 36) + 1, stride=(1 << 36) + 4096)),
        ("keys-2e30", _set(n_layers=1 << 14, E=1 << 16)),
        ("keys-over", _set(n_layers=1 << 11, E=1 << 12)),
        ("offset-overflow", _set(n_layers=1 << 16, E=64, slot_bytes=1 << 36, stride=1 << 36)),
        ("int64-E", _set(E=2**63 - 1)),
        ("uint64-E", _set(E=2**64 - 1)),
        ("stride-0", _set(stride=0)),
        ("stride-slot", _set(stride=SLOT)),
        ("stride-plus-page", _set(stride=STRIDE * 2)),
        ("stride-4095", _set(stride=4095)),
        ("stride-negative", _set(stride=-4096)),
        ("slot-0", _set(slot_bytes=0)),
        ("slot-negative", _set(slot_bytes=-100)),
        ("E-negative", _set(E=-3)),
        ("layers-negative", _set(n_layers=-2)),
        ("version-1", _set(version=1)),
        ("version-3", _set(version=3)),
        ("tag-empty", _set(tag="")),
        ("tag-slash", _set(tag="fp/4")),
        ("tag-space", _set(tag="fp4 ")),
        ("tag-unicode", _set(tag="fp\u0664")),
        ("tag-long", _set(tag="f" * 100_000)),
        ("tag-newline", _set(tag="fp4\n")),
        ("tag-nul", _set(tag="fp4\0")),
    ]
    for label, edit in big:
        for style in ("ts-old", "moet-old"):
            out.append(_side_case(f"{style}-geom-{label}", style, edit))
    lay = [
        ("unsorted", [1, 0]),
        ("duplicate", [0, 0]),
        ("out-of-range", [0, 2]),
        ("negative", [-1, 0]),
        ("huge-id", [0, 2**63]),
        ("too-many", [0, 1, 2]),
        ("hundred-k", [0] * 100_000),
        ("bool", [True, False]),
        ("float", [0.0, 1.0]),
        ("string", ["0", "1"]),
        ("nested", [[0], [1]]),
        ("null", [None]),
    ]
    for label, value in lay:
        for style in ("ts-old", "moet-old", "moet-v2"):
            out.append(_side_case(f"{style}-layers-{label}", style, _set(layers=value)))
    return out


def _sums(edit):
    def f(s):
        edit(s["checksums"])

    return f


def checksum_cases() -> list[PackCase]:
    out = []
    cases = [
        ("short", _sums(lambda c: c["0"].pop())),
        ("long", _sums(lambda c: c["0"].append(1))),
        ("empty-list", _sums(lambda c: c.__setitem__("0", []))),
        ("extra-layer", _sums(lambda c: c.__setitem__("2", [1, 2, 3]))),
        ("missing-layer", _sums(lambda c: c.pop("1"))),
        ("value-2e64", _sums(lambda c: c["0"].__setitem__(1, 2**64))),
        ("value-negative", _sums(lambda c: c["0"].__setitem__(1, -1))),
        ("value-float", _sums(lambda c: c["0"].__setitem__(1, 1.0))),
        ("value-string", _sums(lambda c: c["0"].__setitem__(1, "12"))),
        ("value-null", _sums(lambda c: c["0"].__setitem__(1, None))),
        ("key-x", _sums(lambda c: c.__setitem__("x", c.pop("1")))),
        ("key-negative", _sums(lambda c: c.__setitem__("-1", c.pop("1")))),
        ("key-space", _sums(lambda c: c.__setitem__(" 1", c.pop("1")))),
        ("key-float", _sums(lambda c: c.__setitem__("1.0", c.pop("1")))),
        ("key-empty", _sums(lambda c: c.__setitem__("", c.pop("1")))),
        ("key-huge", _sums(lambda c: c.__setitem__("9" * 30, c.pop("1")))),
        ("not-dict", lambda s: s.__setitem__("checksums", [[1, 2, 3]])),
        ("algo-xxh3-128", _set(checksum="xxh3_128")),
        ("algo-upper", _set(checksum="XXH3_64")),
        ("algo-empty", _set(checksum="")),
        ("algo-md5", _set(checksum="md5")),
        ("sums-without-algo", lambda s: s.pop("checksum")),
    ]
    for label, edit in cases:
        for style in ("ts-v2", "ts-old"):
            out.append(_side_case(f"{style}-sums-{label}", style, edit))
    # a zero-padded key names the same layer as "1": both listings must not pass unseen
    out.append(
        _side_case(
            "ts-old-sums-key-padded",
            "ts-old",
            _sums(lambda c: c.__setitem__("01", c.pop("1"))),
            expect="either",
        )
    )
    out.append(
        _side_case(
            "ts-old-sums-key-twice",
            "ts-old",
            _sums(lambda c: c.__setitem__("01", list(c["1"]))),
            expect="either",
        )
    )
    return out


def _section(i, **kv):
    def f(s):
        s["layout"]["sections"][i].update(kv)

    return f


def layout_cases() -> list[PackCase]:
    out = []
    cases = [
        ("overlap", _section(1, offset=40), "refuse"),
        ("outside-row", _section(1, offset=96), "refuse"),
        ("bytes-mismatch", _section(0, bytes=79), "refuse"),
        ("dtype-unknown", _section(0, dtype="uint3"), "refuse"),
        ("offset-negative", _section(0, offset=-1), "refuse"),
        ("dim-zero", _section(0, shape=[0, 16], bytes=0), "refuse"),
        ("dim-negative", _section(0, shape=[-5, -16]), "refuse"),
        ("dim-huge", _section(0, shape=[2**62, 2**62], bytes=80), "refuse"),
        ("dims-many", _section(0, shape=[1] * 1000 + [80], bytes=80), "either"),
        ("name-twice", _section(1, name="q"), "refuse"),
        ("name-empty", _section(1, name=""), "either"),
        ("codec-unknown", _section(0, codec="bogus"), "refuse"),
        ("codec-int", _section(0, codec=3), "refuse"),
        ("shape-str", _section(0, shape="5x16"), "refuse"),
        ("offset-float", _section(0, offset=0.0), "refuse"),
        ("extra-field", _section(0, extra=1), "refuse"),
        ("no-sections", lambda s: s["layout"].__setitem__("sections", []), "refuse"),
        ("sections-null", lambda s: s["layout"].__setitem__("sections", None), "refuse"),
        ("order-zigzag", lambda s: s["layout"].__setitem__("order", "zigzag"), "refuse"),
        ("kind-missing", lambda s: s["layout"].pop("kind"), "refuse"),
        ("kind-bad", lambda s: s["layout"].__setitem__("kind", "no such/kind"), "refuse"),
        ("params-float", lambda s: s["layout"]["params"].__setitem__("blocks", 5.5), "refuse"),
        ("params-nested", lambda s: s["layout"]["params"].__setitem__("x", {"y": 1}), "refuse"),
        ("params-huge", lambda s: s["layout"]["params"].__setitem__("blocks", 2**80), "refuse"),
        ("layout-extra", lambda s: s["layout"].__setitem__("zz", 1), "refuse"),
        (
            "ten-thousand-sections",
            lambda s: s["layout"].__setitem__(
                "sections",
                [
                    {"name": f"s{i}", "offset": i, "bytes": 1, "dtype": "uint8", "shape": [1]}
                    for i in range(10_000)
                ],
            ),
            "refuse",
        ),
    ]
    for label, edit, expect in cases:
        out.append(_side_case(f"ts-old-layout-{label}", "ts-old", edit, expect))
    return out


def _body_case(name, style, body, expect="refuse", match=None):
    return PackCase(name, lambda d: write_pack(d, style, body=body()), expect, match)


def data_cases() -> list[PackCase]:
    out = []
    for style in ("ts-v2", "moet-old"):
        for size in (
            0,
            1,
            SLOT,
            STRIDE - 1,
            STRIDE,
            2 * STRIDE - 1,
            3 * STRIDE,
            FILE_BYTES - 4096,
            FILE_BYTES - 1,
        ):
            out.append(
                _body_case(
                    f"{style}-truncated-{size}",
                    style,
                    lambda size=size: data()[:size],
                    match=f"file size {size} bytes, expected {FILE_BYTES}",
                )
            )
        for extra in (1, 4095, 4096, FILE_BYTES, 1 << 20):
            out.append(
                _body_case(
                    f"{style}-extended-{extra}",
                    style,
                    lambda extra=extra: data() + bytes(extra),
                    match=f"expected {FILE_BYTES}",
                )
            )
        for kind in (
            "missing",
            "dir",
            "fifo",
            "socket",
            "dangling-link",
            "link-loop",
            "dev-null",
            "dev-zero",
            "link-to-dir",
            "link-to-fifo",
        ):
            for what in ("pack", "sidecar"):
                out.append(
                    PackCase(
                        f"{style}-{what}-is-{kind}",
                        lambda d, s=style, k=kind, w=what: _special(d, s, k, w),
                        match=None,
                    )
                )
        out.append(PackCase(f"{style}-pack-link-to-valid", lambda d, s=style: _linked(d, s, "pack"), "open"))
        out.append(
            PackCase(f"{style}-sidecar-link-to-valid", lambda d, s=style: _linked(d, s, "sidecar"), "open")
        )
        out.append(PackCase(f"{style}-hard-link", lambda d, s=style: _hard(d, s), "open"))
        out.append(
            PackCase(f"{style}-opened-by-json", lambda d, s=style: write_pack(d, s)[:-5] + ".json", "open")
        )
        out.append(
            PackCase(
                f"{style}-sidecar-over-cap", lambda d, s=style: _sparse_sidecar(d, s), match="larger than the"
            )
        )
    return out


def _special(d, style, kind, what):
    path = write_pack(d, style)
    victim = path if what == "pack" else path[:-5] + ".json"
    os.unlink(victim)
    if kind == "missing":
        pass
    elif kind == "dir":
        os.mkdir(victim)
    elif kind == "fifo":
        os.mkfifo(victim)
    elif kind == "socket":
        s, cwd = socket.socket(socket.AF_UNIX), os.getcwd()
        try:  # a relative name: AF_UNIX paths are limited to 108 bytes
            os.chdir(d)
            s.bind(os.path.basename(victim))
        finally:
            os.chdir(cwd)
            s.close()
    elif kind == "dangling-link":
        os.symlink(os.path.join(d, "nowhere"), victim)
    elif kind == "link-loop":
        os.symlink(victim, victim)
    elif kind == "dev-null":
        os.symlink("/dev/null", victim)
    elif kind == "dev-zero":
        os.symlink("/dev/zero", victim)
    elif kind == "link-to-dir":
        os.mkdir(os.path.join(d, "adir"))
        os.symlink(os.path.join(d, "adir"), victim)
    elif kind == "link-to-fifo":
        os.mkfifo(os.path.join(d, "afifo"))
        os.symlink(os.path.join(d, "afifo"), victim)
    return path


def _linked(d, style, what):
    real = write_pack(os.path.join(d, "real"), style)
    path = os.path.join(d, os.path.basename(real))
    if what == "pack":
        os.symlink(real, path)
        with open(path[:-5] + ".json", "wb") as f, open(real[:-5] + ".json", "rb") as g:
            f.write(g.read())
    else:
        with open(path, "wb") as f:
            f.write(data())
        os.symlink(real[:-5] + ".json", path[:-5] + ".json")
    return path


def _hard(d, style):
    real = write_pack(os.path.join(d, "real"), style)
    path = os.path.join(d, os.path.basename(real))
    os.link(real, path)
    os.link(real[:-5] + ".json", path[:-5] + ".json")
    return path


def _sparse_sidecar(d, style):
    path = write_pack(d, style)
    with open(path[:-5] + ".json", "r+b") as f:
        f.truncate((64 << 20) + 1)  # sparse: refused by its size, never read
    return path


def row_cases() -> list[PackCase]:
    """Rows changed in place after the sidecar was written: only checksums can tell."""
    out = []
    for l in range(L):
        for e in range(E):
            for where, at in (("first", 0), ("middle", SLOT // 2), ("last", SLOT - 1)):

                def body(l=l, e=e, at=at):
                    b = data()
                    b[(l * E + e) * STRIDE + at] ^= 0xFF
                    return b

                for style in ("ts-v2", "ts-old"):
                    out.append(
                        PackCase(
                            f"{style}-row-{l}-{e}-{where}",
                            lambda d, s=style, b=body: write_pack(d, s, body=b()),
                            "verify_fail",
                            bad_rows=((l, e),),
                        )
                    )

            def pad(l=l, e=e):
                b = data()
                b[(l * E + e) * STRIDE + SLOT : (l * E + e + 1) * STRIDE] = b"\xaa" * (STRIDE - SLOT)
                return b

            out.append(
                PackCase(f"ts-v2-padding-{l}-{e}", lambda d, b=pad: write_pack(d, "ts-v2", body=b()), "open")
            )

            def hole(l=l, e=e):
                b = data()
                b[(l * E + e) * STRIDE : (l * E + e) * STRIDE + SLOT] = bytes(SLOT)
                return b

            out.append(
                PackCase(
                    f"ts-old-hole-{l}-{e}",
                    lambda d, b=hole: write_pack(d, "ts-old", body=b()),
                    "verify_fail",
                    bad_rows=((l, e),),
                )
            )

            def wrong_sum(s, l=l, e=e):
                s["checksums"][str(l)][e] ^= 1

            out.append(_side_case(f"ts-v2-wrong-sum-{l}-{e}", "ts-v2", wrong_sum, "verify_fail"))
            out[-1].bad_rows = ((l, e),)
    # an unlisted layer full of garbage is never served
    for style in STYLES:

        def build(d, style=style):
            side = sidecar(style, layers=(0,))
            name = pack_name(style, side)
            body = data()
            body[E * STRIDE :] = b"\x5a" * (FILE_BYTES - E * STRIDE)
            return write_pack(d, style, side, body=body, name=name)

        out.append(PackCase(f"{style}-unlisted-garbage", build, "open", written=(0,)))
    return out


def name_cases() -> list[PackCase]:
    out = []
    k = key20(sidecar("ts-v2"))
    names = [
        ("rank-eq-world", f"fp4.v2.{k}.rank1of1.pack"),
        ("world-0", "fp4.rank0of0.pack"),
        ("pp-eq", f"fp4.v2.{k}.rank0of1.pp1of1.pack"),
        ("pp-0", "fp4.rank0of1.pp0of0.pack"),
        ("key20-upper", f"fp4.v2.{k.upper()}.rank0of1.pack"),
        ("key20-short", f"fp4.v2.{k[:19]}.rank0of1.pack"),
        ("key20-other", f"fp4.v2.{'0' * 20}.rank0of1.pack"),
        ("tag-mismatch", "fp8.rank0of1.pack"),
        ("double-ext", "fp4.rank0of1.pack.pack"),
        ("no-rank", "fp4.pack"),
        ("v3", f"fp4.v3.{k}.rank0of1.pack"),
        ("rank-huge", "fp4.rank99999999999999999999of1.pack"),
        ("rank-sign", "fp4.rank-1of1.pack"),
        ("space", "fp4 .rank0of1.pack"),
        ("trailing-dot", "fp4.rank0of1.pack."),
        ("trailing-newline", "fp4.rank0of1.pack\n"),
        ("unicode-digit", "fp4.rank\u0660of1.pack"),
    ]
    for label, name in names:
        for style in ("ts-old", "moet-old"):
            out.append(PackCase(f"{style}-name-{label}", lambda d, s=style, n=name: write_pack(d, s, name=n)))
    for style in ("ts-v2", "moet-v2"):

        def pp(d, style=style):
            return write_pack(d, style, name=pack_name(style, rank="rank0of1.pp0of2"))

        out.append(PackCase(f"{style}-name-pp-valid", pp, "open"))
    # directories
    out.append(PackCase("dir-two-candidates", _two, match="2 candidate packs"))
    out.append(PackCase("dir-no-candidate", lambda d: _dir_of(d, []), match="no pack named"))
    out.append(
        PackCase(
            "dir-only-junk-names",
            lambda d: _dir_of(d, ["fp4.pack", "x.rank9of1.pack"]),
            match="no pack named",
        )
    )
    out.append(
        PackCase(
            "dir-other-world", lambda d: _dir_of(d, ["v2"]), match="no pack named", open_kwargs={"world": 2}
        )
    )
    out.append(PackCase("dir-tag-picks-one", _two_tags, "open", open_kwargs={"tag": "fp4"}))
    out.append(PackCase("dir-of-one", lambda d: _dir_of(d, ["v2"]), "open"))
    out.append(PackCase("dir-candidate-is-fifo", _dir_fifo))
    return out


def _dir_of(d, kinds):
    os.makedirs(d, exist_ok=True)
    for k in kinds:
        if k == "v2":
            write_pack(d, "ts-v2")
        else:
            with open(os.path.join(d, k), "wb") as f:
                f.write(b"x")
    return d


def _two(d):
    write_pack(d, "ts-v2")
    write_pack(d, "moet-old")
    return d


def _two_tags(d):
    write_pack(d, "ts-v2")
    side = sidecar("moet-old")
    side["tag"] = "base"
    write_pack(d, "moet-old", side, name="base.rank0of1.pack")
    return d


def _dir_fifo(d):
    os.makedirs(d)
    os.mkfifo(os.path.join(d, "fp4.rank0of1.pack"))
    with open(os.path.join(d, "fp4.rank0of1.json"), "w") as f:
        json.dump(sidecar("moet-old"), f)
    return d


def unknown_field_cases() -> list[PackCase]:
    """vLLM-Moet extras are tolerated only under a key20 name; tierstore sidecars are strict."""
    out = []
    for i, (k, v) in enumerate(
        [("pool_version", 3), ("zz", None), ("quant_extra", {"a": [1]}), ("Layers", [0]), ("layout_v2", "x")]
    ):
        for style, expect in (
            ("moet-v2", "open"),
            ("moet-old", "refuse"),
            ("ts-v2", "refuse"),
            ("ts-old", "refuse"),
        ):
            out.append(
                _side_case(
                    f"{style}-unknown-{i}",
                    style,
                    _set(**{k: v}),
                    expect,
                    match=None if expect == "open" else "unknown field",
                )
            )
    return out


def all_cases() -> list[PackCase]:
    from hostile.packs import field_cases, structure_cases

    return (
        field_cases()
        + structure_cases()
        + geometry_cases()
        + checksum_cases()
        + layout_cases()
        + data_cases()
        + row_cases()
        + name_cases()
        + unknown_field_cases()
    )

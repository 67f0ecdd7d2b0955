"""Write-side I/O faults for the hostile suite: every writer the product has (the atomic
helpers, the warm-start snapshot writers, PackWriter creating, resuming and rewriting
a pack) against a failing open / write / fsync / rename / ftruncate / pwrite /
fdatasync / makedirs (hostile/syscall_faults.py), with the errnos a full disk, a
quota, a read-only or dying device give. Each case records what it saw; the test
module judges (one line naming the file, the offset for byte writes, nothing on disk
half-written: no temp left, the old file intact or a pack whose listed layers verify)."""

from __future__ import annotations

import errno
import itertools
from dataclasses import dataclass

E_ = errno
OPEN_ERRNOS = (E_.ENOSPC, E_.EDQUOT, E_.EACCES, E_.EMFILE, E_.EROFS)
WRITE_ERRNOS = (E_.ENOSPC, E_.EDQUOT, E_.EIO, E_.EFBIG)
SYNC_ERRNOS = (E_.EIO, E_.ENOSPC, E_.EDQUOT)
RENAME_ERRNOS = (E_.EXDEV, E_.EACCES, E_.EBUSY, E_.EROFS, E_.ENOSPC)
TRUNC_ERRNOS = (E_.EFBIG, E_.ENOSPC, E_.EIO)

PAYLOAD = 3 * 8192 + 123  # bytes an atomic writer writes (several FileIO writes)
PL, PE, PSLOT = 3, 4, 3000  # the packs the PackWriter cases write


@dataclass(frozen=True)
class WFault:
    writer: str
    call: str
    err: int
    nth: int = 1
    at_byte: int | None = None
    match: str | None = None

    @property
    def name(self) -> str:
        return (
            f"{self.writer}-{self.call}-{errno.errorcode[self.err]}-n{self.nth}-b{self.at_byte}-{self.match}"
        )


ATOMIC = (
    "write_atomic",
    "write_atomic_with",
    "write_atomic_async",
    "save_poolmon",
    "snapshot_now",
    "write_warm_file",
)


def _atomic_cases(writer: str) -> list[WFault]:
    out = [WFault(writer, "open", e, match=".tmp-") for e in OPEN_ERRNOS]
    small = writer in ("save_poolmon", "snapshot_now", "write_warm_file")  # a few hundred bytes
    at = (0, 1, 32, 100) if small else (0, 1, 4096, 8192 + 5, PAYLOAD - 1)
    out += [WFault(writer, "write", e, at_byte=b) for e, b in itertools.product(WRITE_ERRNOS, at)]
    out += [WFault(writer, "fsync", e) for e in SYNC_ERRNOS]
    out += [WFault(writer, "replace", e) for e in RENAME_ERRNOS]
    return out


def _sized_cases() -> list[WFault]:
    w = "create_sized_atomic"
    return (
        [WFault(w, "open", e, match=".tmp-") for e in OPEN_ERRNOS]
        + [WFault(w, "ftruncate", e) for e in TRUNC_ERRNOS]
        + [WFault(w, "fsync", e) for e in SYNC_ERRNOS]
        + [WFault(w, "rename", e) for e in RENAME_ERRNOS]
    )


def _pack_cases(writer: str) -> list[WFault]:
    """PackWriter: ``pack_create`` makes a pack and writes its PL layers; ``pack_resume``
    writes the missing last layer of a pack; ``pack_rewrite`` rewrites layer 1 of a
    complete one. The nth call / byte budget walks the fault through every step."""
    out = []
    if writer == "pack_create":
        out += [WFault(writer, "makedirs", e, match="newpack") for e in (E_.EACCES, E_.ENOSPC, E_.EROFS)]
        out += [WFault(writer, "rename", e) for e in RENAME_ERRNOS]  # the sparse pack
        out += [WFault(writer, "ftruncate", e) for e in TRUNC_ERRNOS]
        out += [
            WFault(writer, "open", e, nth=n, match=".tmp-")
            for e, n in itertools.product(OPEN_ERRNOS, (1, 2, 3))
        ]  # sidecar, pack, ...
    out += [WFault(writer, "open", e, match=".lock") for e in OPEN_ERRNOS]
    layers = PL if writer == "pack_create" else 1
    # sidecar publishes: the empty one + one per layer (create), one (resume), the
    # unlisting one + the listing one (rewrite)
    publishes = {"pack_create": PL + 1, "pack_resume": 1, "pack_rewrite": 2}[writer]
    out += [
        WFault(writer, "replace", e, nth=n)
        for e, n in itertools.product((E_.EXDEV, E_.EACCES, E_.ENOSPC), range(1, publishes + 1))
    ]
    # file fsyncs are the odd calls (each is followed by its directory's fsync, whose
    # failure only weakens durability and is ignored); create also fsyncs the sparse pack
    file_fsyncs = publishes + (writer == "pack_create")
    out += [
        WFault(writer, "fsync", e, nth=2 * n - 1)
        for e, n in itertools.product((E_.EIO, E_.ENOSPC), range(1, file_fsyncs + 1))
    ]
    at = (0, 1, 150) + ((700,) if publishes > 1 else ())
    out += [WFault(writer, "write", e, at_byte=b) for e, b in itertools.product((E_.ENOSPC, E_.EDQUOT), at)]
    rows = layers * PE * PSLOT
    at = sorted({0, 1, PSLOT - 1, PSLOT, PSLOT + 17, rows // 2, rows - 1})
    out += [
        WFault(writer, "pwrite", e, at_byte=b)
        for e, b in itertools.product((E_.ENOSPC, E_.EDQUOT, E_.EIO), at)
    ]
    out += [
        WFault(writer, "fdatasync", e, nth=n)
        for e, n in itertools.product((E_.EIO, E_.ENOSPC), range(1, layers + 1))
    ]
    return out


def write_cases() -> list[WFault]:
    out = [c for w in ATOMIC for c in _atomic_cases(w)] + _sized_cases()
    for w in ("pack_create", "pack_resume", "pack_rewrite"):
        out += _pack_cases(w)
    return out

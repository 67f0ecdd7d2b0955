"""Reading pack files: ``Pack.open`` validates everything before a row is read.

A pack is ``n_layers * E`` rows of ``slot_bytes`` bytes at ``stride`` (4 KiB
aligned) spacing, plus a `.json` sidecar. Format spec: docs/FORMAT.md. Writer:
``tierstore.format.writer.PackWriter``.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable

import numpy as np
import xxhash

from tierstore.errors import ConfigError, FormatError, TierIOError, TierstoreError
from tierstore.files.closing import Closing
from tierstore.files.untrusted import open_regular
from tierstore.format.sidecar import (
    DEFAULT_CHECKSUM,
    PackName,
    RowLayout,
    RowSection,
    Sidecar,
    key20_of,
    load_sidecar,
    sidecar_path_of,
)

__all__ = ["RowLayout", "RowSection", "find_pack", "VerifyReport"]

_VERIFY_CHUNK = 64 << 20  # bytes read per pread during verify: its whole buffer, whatever
# the row size (a row larger than this is hashed piece by piece)


def find_pack(
    directory: str,
    *,
    tag: str | None = None,
    rank: int = 0,
    world: int = 1,
    pp: tuple[int, int] | None = None,
) -> str:
    """The one pack in ``directory`` for (tag, rank, world, pp); an error when none or several."""
    pp_part = f".pp{pp[0]}of{pp[1]}" if pp else ""
    names = []
    for p in sorted(glob.glob(os.path.join(glob.escape(directory), "*.pack"))):
        try:
            n = PackName.parse(p)
        except FormatError:
            continue
        if (tag is None or n.tag == tag) and (n.rank, n.world, n.pp) == (rank, world, pp):
            names.append(p)
    want = f"{tag or '<any tag>'}[.v2.<key20>].rank{rank}of{world}{pp_part}.pack"
    if not names:
        raise FormatError(f"{directory}: no pack named {want}")
    if len(names) > 1:
        raise FormatError(
            f"{directory}: {len(names)} candidate packs for {want}: "
            + ", ".join(os.path.basename(n) for n in names)
        )
    return names[0]


def _naming(exc: TierstoreError, given: str, path: str) -> TierstoreError:
    """``exc`` with its message naming ``given``, the path the caller passed, when it names
    only the other file of the pair (a sidecar given, an error about its .pack; a .pack
    given, an error about its sidecar): ``x.json: its pack x.pack: file size ...``.
    The type and attributes (a TierIOError's path, offset, errno) are kept."""
    text = str(exc)
    if given in text:
        return exc
    side = sidecar_path_of(path)
    for other, what in ((path, "its pack"), (side, "its sidecar")):
        if text.startswith(other + ": "):
            text = f"{given}: {what} {os.path.basename(other)}: {text[len(other) + 2 :]}"
            break
    else:
        text = f"{given}: {text}"
    exc.args = (*exc.args[:-1], text) if isinstance(exc, OSError) and len(exc.args) > 1 else (text,)
    return exc


class VerifyReport:
    """What ``Pack.verify`` checked: rows and bytes hashed, and rows it could not check."""

    def __init__(self, rows_checked: int, bytes_checked: int, rows_unchecked: int):
        self.rows_checked, self.bytes_checked = rows_checked, bytes_checked
        self.rows_unchecked = rows_unchecked

    def __repr__(self) -> str:
        return (
            f"VerifyReport(rows_checked={self.rows_checked}, bytes={self.bytes_checked}, "
            f"rows_unchecked={self.rows_unchecked})"
        )


class Pack(Closing):
    """An open, validated pack. Holds one O_RDONLY fd; ``close()`` or use as a context
    manager. Thread safety: all methods are safe to call concurrently (pread only)."""

    def __init__(self, path: str, sidecar: Sidecar, name: PackName, fd: int, unknown_fields: list[str]):
        self.path = path
        self.sidecar_path = sidecar_path_of(path)
        self.sidecar = sidecar
        self.name = name
        self.unknown_fields = unknown_fields
        self._fd = fd
        self.tag = sidecar.tag
        self.n_layers = sidecar.n_layers
        self.n_experts = sidecar.E
        self.slot_bytes = sidecar.slot_bytes
        self.stride = sidecar.stride
        self.layers = tuple(sidecar.layers)
        self.written = np.zeros(self.n_layers, dtype=bool)
        self.written[list(self.layers)] = True
        self.layout: RowLayout | None = sidecar.layout
        self.ckpt_id = sidecar.ckpt_id
        self.identity = sidecar.identity()
        self.key20 = key20_of(self.identity)
        self.checksum_algo = sidecar.checksum
        self._checksums = {l: np.asarray(v, dtype=np.uint64) for l, v in (sidecar.checksums or {}).items()}
        self._sum_table: np.ndarray | None = None  # dense [n_layers * E], built on first use
        st = os.fstat(fd)
        self._opened_as = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        self.mtime_changes = 0  # touches taken as the new baseline (check_unchanged)
        self._sidecar_as = _file_id(self.sidecar_path)

    # -- opening ---------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        path: str | os.PathLike,
        *,
        tag: str | None = None,
        rank: int = 0,
        world: int = 1,
        pp: tuple[int, int] | None = None,
    ) -> Pack:
        """Open a `.pack` file (or its `.json`), or the one pack in a directory that matches
        tag/rank/world/pp. Raises FormatError naming the file on any mismatch."""
        given = path = os.fspath(path)
        if os.path.isdir(path):
            rank, world, pp = PackName.checked(rank, world, pp, f"Pack.open({path})")
            path = find_pack(path, tag=tag, rank=rank, world=world, pp=pp)
        elif path.endswith(".json"):
            path = path[: -len(".json")] + ".pack"
        try:
            return cls._open_file(path, sidecar_given=path != given and not os.path.isdir(given))
        except TierstoreError as exc:
            raise _naming(exc, given, path) from None

    @classmethod
    def _open_file(cls, path: str, *, sidecar_given: bool) -> Pack:
        try:
            name = PackName.parse(path)
        except FormatError:
            if not sidecar_given:
                raise
            raise FormatError(
                f"{path[: -len('.pack')]}.json: not a pack's sidecar; expected "
                "<tag>.v2.<key20>.rank<r>of<w>[.pp<p>of<q>].json beside its "
                ".pack, or the .pack itself"
            ) from None
        side = sidecar_path_of(path)
        before = _file_id(side)
        sidecar, unknown = load_sidecar(side, key20_in_name=bool(name.key20))
        if _file_id(side) != before:  # a writer republished it while we read it
            raise FormatError(
                f"{side}: sidecar changed while it was read (a writer is publishing); open the pack again"
            )
        if sidecar.tag != name.tag:
            raise FormatError(
                f"{path}: sidecar tag {sidecar.tag!r} does not match the name's tag {name.tag!r}"
            )
        try:
            fd = open_regular(path, "pack file")  # a FIFO or device never blocks here
        except FileNotFoundError:
            if sidecar_given:
                raise FormatError(
                    f"{side}: a sidecar whose pack file {os.path.basename(path)} is missing"
                ) from None
            raise FormatError(
                f"{path}: pack file is missing (sidecar {os.path.basename(side)} exists)"
            ) from None
        try:
            expected = sidecar.n_layers * sidecar.E * sidecar.stride
            found = os.fstat(fd).st_size
            if found != expected:
                raise FormatError(
                    f"{path}: file size {found} bytes, expected {expected} "
                    f"({sidecar.n_layers} layers x {sidecar.E} experts x stride {sidecar.stride})"
                )
            if name.key20 is not None:
                want = key20_of(sidecar.identity())
                if want != name.key20:
                    raise FormatError(
                        f"{path}: key20 in the name is {name.key20}, the sidecar's "
                        f"identity hashes to {want} (another checkpoint or geometry)"
                    )
            pack = cls(path, sidecar, name, fd, unknown)
            pack._sidecar_as = before
            return pack
        except BaseException:
            os.close(fd)
            raise

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __repr__(self) -> str:
        return (
            f"Pack({self.path!r}, tag={self.tag!r}, {self.n_layers}x{self.n_experts} rows "
            f"of {self.slot_bytes} B, {len(self.layers)} layers written)"
        )

    # -- addressing ------------------------------------------------------------------
    @property
    def file_bytes(self) -> int:
        return self.n_layers * self.n_experts * self.stride

    def row_offset(self, layer: int, expert: int) -> int:
        self._check_one(layer, expert)
        return (layer * self.n_experts + expert) * self.stride

    def check_keys(self, keys) -> np.ndarray:
        """(layer, expert) pairs [N, 2] -> dense ids ``layer*E + expert`` (int64 [N]).
        ConfigError for out-of-range keys, FormatError for keys of unwritten layers."""
        k = np.asarray(keys)
        if k.size == 0:
            return np.zeros(0, dtype=np.int64)
        if k.ndim != 2 or k.shape[1] != 2 or not np.issubdtype(k.dtype, np.integer):
            raise ConfigError(
                f"{self.path}: keys must be an integer array [N, 2], found {k.dtype} {list(k.shape)}"
            )
        k = k.astype(np.int64, copy=False)
        layer, expert = k[:, 0], k[:, 1]
        bad = (layer < 0) | (layer >= self.n_layers) | (expert < 0) | (expert >= self.n_experts)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ConfigError(
                f"{self.path}: key {i} (layer {layer[i]}, expert {expert[i]}) out "
                f"of range [0, {self.n_layers}) x [0, {self.n_experts})"
            )
        unwritten = ~self.written[layer]
        if unwritten.any():
            raise FormatError(
                f"layer {int(layer[np.flatnonzero(unwritten)[0]])} is not written in {self.path}"
            )
        return layer * self.n_experts + expert

    def row_offsets(self, dense_ids) -> np.ndarray:
        return np.asarray(dense_ids, dtype=np.int64) * self.stride

    def _check_one(self, layer: int, expert: int) -> None:
        if not (0 <= layer < self.n_layers and 0 <= expert < self.n_experts):
            raise ConfigError(
                f"{self.path}: layer {layer} expert {expert} out of range "
                f"[0, {self.n_layers}) x [0, {self.n_experts})"
            )

    # -- reading ---------------------------------------------------------------------
    def _pread_into(self, buf: memoryview, offset: int) -> None:
        if self._fd < 0:
            from tierstore.errors import ClosedError

            raise ClosedError(f"{self.path}: pack is closed")
        done = 0
        while done < len(buf):
            try:
                n = os.preadv(self._fd, [buf[done:]], offset + done)
            except OSError as exc:
                raise TierIOError(self.path, offset + done, exc.errno or 0) from None
            if n == 0:
                raise FormatError(
                    f"{self.path}: end of file at offset {offset + done:#x}, "
                    f"expected {len(buf) - done} more bytes (truncated pack)"
                )
            done += n

    def read_row(self, layer: int, expert: int) -> np.ndarray:
        """The row's ``slot_bytes`` bytes (a fresh uint8 array). Plain pread: for tests,
        verify and inspection; the store reads through the engine."""
        self._check_one(layer, expert)
        if not self.written[layer]:
            raise FormatError(f"layer {layer} is not written in {self.path}")
        out = np.empty(self.slot_bytes, dtype=np.uint8)
        self._pread_into(memoryview(out), (layer * self.n_experts + expert) * self.stride)
        return out

    @property
    def has_checksums(self) -> bool:
        return self.checksum_algo is not None and bool(self._checksums)

    def row_checksums(self, dense_ids: np.ndarray) -> np.ndarray:
        """Recorded xxh3-64 of rows given as dense ids ``layer * E + expert`` (np.uint64[N],
        0 for a row of a layer without checksums). Vectorised; the table is built once."""
        if self._sum_table is None:
            table = np.zeros(self.n_layers * self.n_experts, dtype=np.uint64)
            for layer, sums in self._checksums.items():
                table[layer * self.n_experts : (layer + 1) * self.n_experts] = sums
            self._sum_table = table
        return self._sum_table[np.asarray(dense_ids, dtype=np.int64)]

    def check_unchanged(self, rows_hashed: bool = False) -> None:
        """FormatError unless the file at ``path`` is still the one this Pack validated:
        same device and inode, same size, same sidecar. A reader that keeps serving a
        replaced, resized or rewritten pack would serve wrong bytes. A modification time
        that moved while all of that stayed (``touch``, a backup tool) is taken as the
        new baseline when the caller's rows were each hashed against the sidecar as they
        were read (``rows_hashed``: a byte changed in place is caught there) and every
        written layer has sums; it is counted in ``mtime_changes``. Otherwise nothing
        could tell a touch from an in-place rewrite (``dd``), so it is refused."""
        try:
            now = os.stat(self.path)
            mine = os.fstat(self._fd)
        except OSError as exc:
            raise FormatError(
                f"{self.path}: pack file is gone since Pack.open ({exc.strerror}); reopen it"
            ) from None
        dev, ino, size, mtime = self._opened_as
        if (now.st_dev, now.st_ino) != (dev, ino):
            raise FormatError(
                f"{self.path}: pack file was replaced since Pack.open (inode "
                f"{ino} -> {now.st_ino}); reopen it with Pack.open"
            )
        touched = mine.st_size == size and mine.st_mtime_ns != mtime
        if mine.st_size != size or (touched and not (rows_hashed and self._sums_cover_all())):
            raise FormatError(
                f"{self.path}: pack file was modified since Pack.open (size "
                f"{size} -> {mine.st_size}, mtime changed); reopen it with Pack.open"
            )
        # A PackWriter publishes a new sidecar (a new inode) before and after every layer
        # it writes: this catches a rewrite even within the pack mtime's clock tick.
        if _file_id(self.sidecar_path) != self._sidecar_as:
            raise FormatError(
                f"{self.path}: its sidecar was republished since Pack.open "
                f"(a writer changed the pack); reopen it with Pack.open"
            )
        if touched:
            self._opened_as = (dev, ino, size, mine.st_mtime_ns)
            self.mtime_changes += 1

    def _sums_cover_all(self) -> bool:
        return self.checksum_algo is not None and all(l in self._checksums for l in self.layers)

    def row_checksum(self, layer: int, expert: int) -> int | None:
        """The recorded checksum of a written row, or None (old sidecar / unwritten layer)."""
        self._check_one(layer, expert)
        sums = self._checksums.get(layer)
        return None if sums is None else int(sums[expert])

    def verify(self, progress: bool | Callable[[int, int], None] = False) -> VerifyReport:
        """Hash every written row and compare with the sidecar. Raises FormatError naming
        the first bad row (layer, expert, offset, found vs expected). ``progress`` may be a
        callback(rows_done, rows_total) or True for a rich progress bar."""
        rows_total = len(self.layers) * self.n_experts
        if self.checksum_algo is None:
            # old sidecar: nothing recorded; still prove every written row is readable
            for layer in self.layers:
                for _ in self._row_digests(layer, hashing=False):
                    pass
            return VerifyReport(0, 0, rows_total)
        if self.checksum_algo != DEFAULT_CHECKSUM:  # validated at open; defensive
            raise FormatError(f"{self.sidecar_path}: cannot verify checksum {self.checksum_algo!r}")
        bar = _progress(progress, rows_total, os.path.basename(self.path))
        done = 0
        try:
            for layer in self.layers:
                expected = self._checksums[layer]
                for e, found in self._row_digests(layer):
                    if found != int(expected[e]):
                        off = (layer * self.n_experts + e) * self.stride
                        raise FormatError(
                            f"{self.path}: layer {layer} expert {e} at offset {off:#x}: "
                            f"{self.checksum_algo} {found:#018x}, expected {int(expected[e]):#018x}"
                        )
                done += self.n_experts
                bar(done)
        finally:
            bar(None)
        return VerifyReport(rows_total, rows_total * self.slot_bytes, 0)

    def _row_digests(self, layer: int, hashing: bool = True):
        """(expert, xxh3-64 of its row) for every row of ``layer``, read in preads of at
        most _VERIFY_CHUNK bytes into one buffer of that size: several small rows per
        read, or one large row (up to the 64 GiB slot cap) in pieces fed to a streaming
        hash. ``hashing=False`` only proves the rows readable (digests are 0)."""
        if self.slot_bytes <= _VERIFY_CHUNK:
            rows_per_read = max(1, _VERIFY_CHUNK // self.stride)
            buf = np.empty(min(rows_per_read, self.n_experts) * self.stride, dtype=np.uint8)
            view = memoryview(buf)
            for e0 in range(0, self.n_experts, rows_per_read):
                n = min(rows_per_read, self.n_experts - e0)
                # the last row's padding may be skipped: read exactly up to its slot end
                length = (n - 1) * self.stride + self.slot_bytes
                self._pread_into(view[:length], (layer * self.n_experts + e0) * self.stride)
                for i in range(n):
                    row = view[i * self.stride : i * self.stride + self.slot_bytes]
                    yield e0 + i, xxhash.xxh3_64_intdigest(row) if hashing else 0
            return
        view = memoryview(np.empty(_VERIFY_CHUNK, dtype=np.uint8))
        for e in range(self.n_experts):
            h = xxhash.xxh3_64()
            base = (layer * self.n_experts + e) * self.stride
            for off in range(0, self.slot_bytes, _VERIFY_CHUNK):
                piece = view[: min(_VERIFY_CHUNK, self.slot_bytes - off)]
                self._pread_into(piece, base + off)
                if hashing:
                    h.update(piece)
            yield e, h.intdigest() if hashing else 0


def _file_id(path: str) -> tuple | None:
    """(dev, inode, size, mtime_ns) of ``path``, None when it is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _progress(progress, total: int, label: str) -> Callable[[int | None], None]:
    """Adapt ``progress`` to f(done) / f(None) at the end."""
    if callable(progress):
        return lambda done: None if done is None else progress(done, total)
    if not progress:
        return lambda done: None
    from rich.progress import Progress

    p = Progress(transient=True)
    task = p.add_task(f"verify {label}", total=total)
    p.start()

    def update(done):
        if done is None:
            p.stop()
        else:
            p.update(task, completed=done)

    return update

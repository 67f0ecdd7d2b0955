"""PackWriter: crash-safe, resumable writing of a pack, one layer at a time.

Protocol (docs/FORMAT.md, "Crash safety"): flock(LOCK_EX) on `.lock` for the writer's
lifetime (a live ExpertStore holds LOCK_SH on it: no rewrite under a reader, see
format/packlock.py); the empty sidecar is published first, then the full-size sparse pack
file appears by rename; each ``write_layer`` does pwrite + fdatasync, then
republishes the sidecar (temp + fsync + rename + dir fsync) listing the layer.
A crash at any point leaves a pack whose listed layers are fully written.

A writer owns what it creates, and only that: with ``discard_on_error=True`` a writer
whose ``with`` block fails (an interrupt included) removes the pack, sidecar, lock file
and directories it made itself, while it still holds the lock; files it found (a pack it
resumed, another writer's pack beside it) are never touched.
"""

from __future__ import annotations

import bisect
import errno
import logging
import os
import shutil
import stat

import numpy as np
import xxhash

from tierstore import settings
from tierstore.errors import ConfigError, FormatError, TierIOError
from tierstore.files.atomic import create_sized_atomic, remove_quietly, stale_temps, write_atomic
from tierstore.files.closing import Closing
from tierstore.format.packlock import PackBusyError, lock_for_writing
from tierstore.format.sidecar import (
    DEFAULT_CHECKSUM,
    MAX_EXPERTS,
    MAX_LAYERS,
    MAX_SLOT_BYTES,
    SIDECAR_VERSION,
    TAG_RE,
    PackName,
    RowLayout,
    Sidecar,
    encode_sidecar,
    key20_of,
    load_sidecar,
    lock_path_of,
    round_up,
    sidecar_path_of,
    validate_sidecar,
)

DEFAULT_QUANTIZER_ABI = "tierstore-opaque-v1"


class PackReplacedError(TierIOError):
    """The pack path now names another file than the one this writer opened."""

    def __init__(self, path: str, offset: int):
        super().__init__(path, offset, errno.ESTALE, what="write")
        self.args = (
            errno.ESTALE,
            f"{path}: the file was replaced or removed while being "
            f"written (inode changed); refusing to write through it",
        )


log = logging.getLogger("tierstore.format")


class PackWriter(Closing):
    """Write (or resume writing) one pack. Not thread safe; one writer per pack file,
    enforced across processes by flock. ``out`` is a directory (the v2 name with key20
    is chosen) or an explicit `.pack` path. ``discard_on_error``: a ``with`` block (or
    the constructor) that fails removes what this writer created and nothing else
    (``discard``). ``check_space``: refuse up front (ConfigError) when the filesystem
    lacks room for the layers still to write. Errors: ConfigError for bad arguments or
    an identity that differs from an existing pack's, FormatError for a damaged existing
    pack, PackBusyError (naming the holder's pid), LockFileError (a planted lock link),
    PackReplacedError, TierIOError for failed writes."""

    def __init__(
        self,
        out: str | os.PathLike,
        *,
        tag: str,
        n_layers: int,
        n_experts: int,
        slot_bytes: int,
        ckpt_id: str,
        zero_mode: str = "none",
        quantizer_abi: str = DEFAULT_QUANTIZER_ABI,
        layout: RowLayout | None = None,
        rank: int = 0,
        world: int = 1,
        pp: tuple[int, int] | None = None,
        checksum: str = DEFAULT_CHECKSUM,
        discard_on_error: bool = False,
        check_space: bool = False,
    ):
        out = os.fspath(out)
        self._fd = self._lock_fd = -1
        self._closed = False
        self.discard_on_error = bool(discard_on_error)
        # What this writer created (discard() removes exactly these): directories,
        # deepest first; the lock file; the sidecar; the pack file's (dev, inode).
        self._made_dirs: list[str] = []
        self._made_lock = self._made_sidecar = False
        self._ident: tuple[int, int] | None = None
        self._made_pack: tuple[int, int] | None = None
        self._check_space = bool(check_space)
        n_layers, n_experts, slot_bytes = (  # numbers as settings checks them: nan, 1.5, "4"
            settings.argument(f"PackWriter({out}): {name}", value, settings.integer(1, cap))
            for name, value, cap in (
                ("n_layers", n_layers, MAX_LAYERS),
                ("n_experts", n_experts, MAX_EXPERTS),
                ("slot_bytes", slot_bytes, MAX_SLOT_BYTES),
            )
        )
        rank, world, pp = PackName.checked(rank, world, pp, f"PackWriter({out})")
        sc = Sidecar(
            version=SIDECAR_VERSION,
            tag=tag,
            E=int(n_experts),
            n_layers=int(n_layers),
            slot_bytes=int(slot_bytes),
            stride=round_up(int(slot_bytes)),
            ckpt_id=ckpt_id,
            zero_mode=zero_mode,
            quantizer_abi=quantizer_abi,
            layers=[],
            layout=layout,
            checksum=checksum,
            checksums={},
        )
        try:
            if not TAG_RE.match(tag):
                raise FormatError(f"tag {tag!r} is not a valid tag ([A-Za-z0-9_-]+)")
            validate_sidecar(sc, "PackWriter")
        except FormatError as exc:
            raise ConfigError(str(exc)) from None
        self.identity = sc.identity()
        self.key20 = key20_of(self.identity)
        try:
            self.path = self._choose_path(out, PackName(tag, self.key20, rank, world, pp))
            self.sidecar_path = sidecar_path_of(self.path)
            self.lock_path = lock_path_of(self.path)
            self._take_lock()
            self._remove_stale_temps()
            self._sidecar = self._open_or_create(sc)
        except BaseException:
            if self.discard_on_error:
                self.discard()
            else:
                self.close()
            raise

    # -- setup -----------------------------------------------------------------------
    def _choose_path(self, out: str, name: PackName) -> str:
        if not out.endswith(".pack"):
            self._makedirs(out)
            return os.path.join(out, name.filename())
        given = PackName.parse(out)
        if given.tag != name.tag:
            raise ConfigError(f"{out}: name's tag {given.tag!r} differs from tag {name.tag!r}")
        if given.key20 is not None and given.key20 != name.key20:
            raise ConfigError(
                f"{out}: key20 in the name is {given.key20}, this identity hashes to {name.key20}"
            )
        self._makedirs(os.path.dirname(os.path.abspath(out)))
        return out

    def _makedirs(self, directory: str) -> None:
        """Create ``directory`` and its missing parents, remembering which were new."""
        missing, probe = [], os.path.abspath(directory)
        while not os.path.lexists(probe) and os.path.dirname(probe) != probe:
            missing.append(probe)
            probe = os.path.dirname(probe)
        _makedirs(directory)
        self._made_dirs = missing  # deepest first

    def _take_lock(self) -> None:
        """LOCK_EX on the lock file: refused while another writer or a live store holds
        it (tierstore/format/packlock.py)."""
        self._lock_fd, self._made_lock = lock_for_writing(self.lock_path)

    def _remove_stale_temps(self) -> None:
        """Temp files a killed writer left; safe to remove: we hold the lock."""
        for target in (self.path, self.sidecar_path):
            for stale in stale_temps(target):
                remove_quietly(stale)

    def _open_or_create(self, fresh: Sidecar) -> Sidecar:
        size = fresh.n_layers * fresh.E * fresh.stride
        have_sidecar = os.path.exists(self.sidecar_path)
        have_pack = os.path.exists(self.path)
        if not have_sidecar:
            if have_pack:
                raise FormatError(
                    f"{self.path}: pack exists without its sidecar "
                    f"{os.path.basename(self.sidecar_path)}; refusing to overwrite"
                )
            self._require_space(size, whole=True)
            self._made_sidecar = True  # before the write: an interrupt in it is ours too
            write_atomic(self.sidecar_path, encode_sidecar(fresh))
            self._create_sparse(size)
            return fresh
        old, _ = load_sidecar(self.sidecar_path, key20_in_name=True, partial_sums=True)
        self._check_resumable(old, fresh)
        self._require_space((old.n_layers - len(old.layers)) * old.E * old.stride, whole=not old.layers)
        if not have_pack:
            if old.layers:
                raise FormatError(
                    f"{self.path}: pack file is missing but its sidecar lists layers {old.layers[:8]}"
                )
            self._create_sparse(size)
        else:
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC | os.O_NONBLOCK)
            except OSError as exc:
                raise TierIOError(self.path, 0, exc.errno or errno.EIO, what="open") from None
            if not stat.S_ISREG(os.fstat(self._fd).st_mode):
                raise FormatError(f"{self.path}: not a regular file; refusing to write a pack into it")
            found = os.fstat(self._fd).st_size
            if found != size:
                raise FormatError(f"{self.path}: file size {found} bytes, expected {size}")
            st = os.fstat(self._fd)
            self._ident = (st.st_dev, st.st_ino)
        if old.checksums is None:
            old.checksums = {}
        unsummed = [layer for layer in old.layers if layer not in old.checksums]
        if unsummed:
            self._sum_written(old, unsummed)
        return old

    def _sum_written(self, sc: Sidecar, layers: list[int]) -> None:
        """Layers another engine wrote without checksums (vLLM-Moet keeps none): hash them
        as they are on disk, once, and publish the sidecar, so every listed layer has its
        sums from here on (a reader then verifies them like ours)."""
        log.info("%s: hashing %d layer(s) written without checksums: %s", self.path, len(layers), layers[:8])
        buf = bytearray(sc.slot_bytes)
        view = memoryview(buf)
        for layer in layers:
            sums = []
            for e in range(sc.E):
                off = (layer * sc.E + e) * sc.stride
                self._pread_exact(view, off)
                sums.append(xxhash.xxh3_64_intdigest(view))
            sc.checksums[layer] = sums
        self._sidecar = sc
        self._publish()

    def _pread_exact(self, view: memoryview, offset: int) -> None:
        done = 0
        while done < len(view):
            try:
                n = os.preadv(self._fd, [view[done:]], offset + done)
            except OSError as exc:
                raise TierIOError(self.path, offset + done, exc.errno, what="read") from None
            if n <= 0:
                raise FormatError(f"{self.path}: unexpected end of file at offset {offset + done:#x}")
            done += n

    def _check_resumable(self, old: Sidecar, fresh: Sidecar) -> None:
        diffs = [
            f"{k}: existing {old.identity()[k]!r}, new {v!r}"
            for k, v in fresh.identity().items()
            if old.identity()[k] != v
        ]
        if old.layout != fresh.layout:
            diffs.append("layout differs")
        # A sidecar with no checksum at all (vLLM-Moet's own, or an older tierstore's) is
        # resumed: its layers keep no sums (read unverified, as there), new ones get ours.
        if old.checksum != fresh.checksum and old.layers and old.checksum is not None:
            diffs.append(f"checksum: existing {old.checksum!r}, new {fresh.checksum!r}")
        if diffs:
            raise ConfigError(
                f"{self.path}: exists with another identity; cannot resume (" + "; ".join(diffs) + ")"
            )
        old.checksum = fresh.checksum

    def _create_sparse(self, size: int) -> None:
        self._fd = create_sized_atomic(self.path, size)  # unwritten layers stay holes
        st = os.fstat(self._fd)
        self._ident = self._made_pack = (st.st_dev, st.st_ino)

    def _require_space(self, need: int, whole: bool) -> None:
        """With ``check_space``: ConfigError unless the filesystem has ``need`` bytes free
        for the layers still to write. A resumed pack's written layers already hold their
        blocks (the file is sparse), so it asks only for the rest, not the whole pack."""
        if not self._check_space or need <= 0:
            return
        directory = os.path.dirname(os.path.abspath(self.path))
        try:
            free = shutil.disk_usage(directory).free
        except OSError:
            return  # cannot tell: the writes themselves will say ENOSPC, naming the offset
        if need > free:
            what = "the pack needs" if whole else "the layers still to write need"
            raise ConfigError(
                f"{self.path}: {what} {need / 1e9:.2f} GB, {directory} has "
                f"{free / 1e9:.2f} GB free; choose another place or a smaller "
                f"pack"
            )

    # -- writing ---------------------------------------------------------------------
    @property
    def written_layers(self) -> tuple[int, ...]:
        return tuple(self._sidecar.layers)

    def is_written(self, layer: int) -> bool:
        layers = self._sidecar.layers  # sorted: a resume of 10^4 layers asks
        i = bisect.bisect_left(layers, layer)  # this once per layer
        return i < len(layers) and layers[i] == layer

    def _check_same_file(self, offset: int) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            raise PackReplacedError(self.path, offset) from None
        if (st.st_dev, st.st_ino) != self._ident:
            raise PackReplacedError(self.path, offset)

    def _publish(self) -> None:
        self._check_same_file(0)
        write_atomic(self.sidecar_path, encode_sidecar(self._sidecar))

    def write_layer(self, layer: int, rows) -> None:
        """Write all E rows of ``layer`` (uint8 [E, slot_bytes], numpy or CPU torch) and
        publish it. Rewriting a written layer first unlists it, so a crash mid-rewrite
        leaves it unlisted rather than half old, half new."""
        if self._closed:
            from tierstore.errors import ClosedError

            raise ClosedError(f"{self.path}: writer is closed")
        sc = self._sidecar
        if not 0 <= layer < sc.n_layers:
            raise ConfigError(f"{self.path}: layer {layer} out of range [0, {sc.n_layers})")
        arr = np.asarray(rows)
        if arr.dtype != np.uint8 or arr.shape != (sc.E, sc.slot_bytes):
            raise ConfigError(
                f"{self.path}: layer {layer}: rows must be uint8 "
                f"[{sc.E}, {sc.slot_bytes}], found {arr.dtype} {list(arr.shape)}"
            )
        arr = np.ascontiguousarray(arr)
        if layer in sc.layers:
            old_sums = sc.checksums.pop(layer, None)
            sc.layers.remove(layer)
            try:
                self._publish()
            except BaseException:
                # Not unlisted on disk: the sidecar there still lists the layer (old
                # rows, old sums), so our view must too, or a retry would overwrite
                # rows a published sidecar vouches for without unlisting them first.
                sc.layers = sorted(sc.layers + [layer])
                if old_sums is not None:
                    sc.checksums[layer] = old_sums
                raise
        sums = [xxhash.xxh3_64_intdigest(memoryview(arr[e])) for e in range(sc.E)]
        base = layer * sc.E * sc.stride
        self._check_same_file(base)
        for e in range(sc.E):
            self._pwrite_all(memoryview(arr[e]), base + e * sc.stride)
        try:
            os.fdatasync(self._fd)
        except OSError as exc:
            raise TierIOError(self.path, base, exc.errno, what="fdatasync") from None
        sc.layers = sorted(sc.layers + [layer])
        sc.checksums[layer] = sums
        try:
            self._publish()
        except BaseException:
            sc.layers.remove(layer)
            del sc.checksums[layer]
            raise

    def _pwrite_all(self, view: memoryview, offset: int) -> None:
        done = 0
        while done < len(view):
            try:
                n = os.pwrite(self._fd, view[done:], offset + done)
            except OSError as exc:
                raise TierIOError(self.path, offset + done, exc.errno, what="write") from None
            if n <= 0:
                raise TierIOError(self.path, offset + done, errno.EIO, what="write")
            done += n

    # -- lifetime --------------------------------------------------------------------
    def open_pack(self):
        """A reader over what is published so far."""
        from tierstore.format.pack import Pack

        return Pack.open(self.path)

    def close(self) -> None:
        self._closed = True
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # closing the fd drops the flock
            self._lock_fd = -1

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and self.discard_on_error:
            self.discard()
        else:
            self.close()

    def discard(self) -> list[str]:
        """Remove what this writer created -- its pack file (the same inode), sidecar,
        lock file and directories -- and close. Files it found (a resumed pack, other
        packs beside it) stay. Runs while the lock is still held, so no other writer of
        this pack can be between our files; the lock file goes last. Returns the paths
        removed. A killed process runs none of this: what it left is resumable."""
        removed = []
        if self._lock_fd >= 0:
            if self._made_pack is not None and _same_file(self.path, self._made_pack):
                removed += _unlink(self.path)
            if self._made_sidecar:
                removed += _unlink(self.sidecar_path)
            if self._made_lock:
                removed += _unlink(self.lock_path)  # holders of the old inode re-open
        self.close()
        for d in self._made_dirs:  # deepest first; only if empty
            try:
                os.rmdir(d)
                removed.append(d)
            except OSError:
                break
        self._made_dirs = []
        return removed


def _same_file(path: str, ident: tuple[int, int]) -> bool:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == ident


def _unlink(path: str) -> list[str]:
    try:
        os.unlink(path)
        return [path]
    except OSError:
        return []


def _makedirs(directory: str) -> None:
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:  # a file in the way, a read-only or full filesystem, EACCES
        raise TierIOError(directory, 0, exc.errno or errno.EIO, what="mkdir") from None


__all__ = ["PackWriter", "PackBusyError", "PackReplacedError", "DEFAULT_QUANTIZER_ABI"]

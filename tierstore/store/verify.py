"""Checksums on load: which rows of an engine batch are checked against the sidecar.

The pack's sidecar records an xxh3-64 per written row. A batch hands the expected
values to the engine (``Engine.submit(checksums=...)``), which hashes each row in the
reader threads as it lands (rows of any size: segment by segment, stage_bytes each, in
file order, with one streaming XXH3 state per row), before the store publishes anything:
a mismatch fails
the row (EBADMSG, its offset), the batch rolls back, and the caller gets a TierIOError
naming the file, layer, expert and offset.

Modes (``verify=`` option, ``TIERSTORE_VERIFY``):
* ``always``: every row read from the file is hashed, every time;
* ``first`` (default): a row is hashed the first time this store reads it; later
  re-reads (after an eviction) are not. Corruption already on disk when the server
  starts is caught, and the steady-state cost is nil once the hot set has been seen;
* ``off``: nothing is hashed (also when the pack has no checksums).
Rows served from the arena (offset -1) are never re-hashed: they were checked when read.
"""
from __future__ import annotations

import numpy as np

MODES = ("always", "first", "off")


class RowVerifier:
    def __init__(self, pack, mode: str):
        self.pack = pack
        self.mode = mode if pack.has_checksums else "off"
        n_keys = int(pack.n_layers) * int(pack.n_experts)
        self._seen = np.zeros(n_keys, dtype=bool) if self.mode == "first" else None

    @property
    def hashes_every_read(self) -> bool:
        """Every row read from the file is hashed before it is published: a pack whose
        mtime moved (``touch``) with inode, size and sidecar unchanged may then keep
        serving (``Pack.check_unchanged(rows_hashed=...)``)."""
        return self.mode == "always"

    def checksums(self, keys: np.ndarray, offsets: np.ndarray) -> np.ndarray | None:
        """Expected sums for a batch (``keys`` dense ids, ``offsets`` -1 for arena rows), or
        None when nothing in it needs hashing."""
        if self.mode == "off":
            return None
        read = offsets >= 0
        if self.mode == "first" and not (read & ~self._seen[keys]).any():
            return None
        if not read.any():
            return None
        return self.pack.row_checksums(keys)

    def passed(self, keys: np.ndarray, offsets: np.ndarray) -> None:
        """The batch landed with its sums checked: remember its read rows ("first")."""
        if self._seen is not None:
            self._seen[keys[offsets >= 0]] = True

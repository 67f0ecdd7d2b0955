"""Checksums on load: which rows of an engine batch are checked against the sidecar.

The pack's sidecar records an xxh3-64 per written row. A batch hands the expected
values to the engine (``Engine.submit(checksums=...)``), which hashes each row in the
reader threads as it lands (rows of any size: segment by segment, stage_bytes each, in
file order, with one streaming XXH3 state per row), before the store publishes anything:
a mismatch fails
the row (EBADMSG, its offset), the batch rolls back, and the caller gets a TierIOError
naming the file, layer, expert and offset.

Modes (``verify=`` option, ``TIERSTORE_VERIFY``):
* ``always`` (default): every row read from the file (disk or page cache) is hashed,
  every time, before it is published: a row that rotted on disk after an earlier read
  is refused when it is read again, never served;
* ``off``: nothing is hashed (also when the pack has no checksums): the explicit opt-out.
* ``first``: the old name of a mode that hashed a row only the first time a store read
  it, and so published a later re-read (after an eviction) unchecked. It is accepted as
  a spelling of ``always``, with a FutureWarning (settings.verify_mode).
Rows served from the arena (offset -1) are never re-hashed: they were checked when read
into it, and the arena is this process's memory, not the disk or its cache.
"""

from __future__ import annotations

import numpy as np

from tierstore.settings import VERIFY_MODES as MODES


class RowVerifier:
    def __init__(self, pack, mode: str):
        """``mode`` as settings.verify_mode returned it: "always" or "off"."""
        if mode not in MODES:
            raise ValueError(f"RowVerifier: mode must be one of {', '.join(MODES)}, found {mode!r}")
        self.pack = pack
        self.mode = mode if pack.has_checksums else "off"

    @property
    def hashes_every_read(self) -> bool:
        """Every row read from the file is hashed before it is published: a pack whose
        mtime moved (``touch``) with inode, size and sidecar unchanged may then keep
        serving (``Pack.check_unchanged(rows_hashed=...)``)."""
        return self.mode == "always"

    def checksums(self, keys: np.ndarray, offsets: np.ndarray) -> np.ndarray | None:
        """Expected sums for a batch (``keys`` dense ids, ``offsets`` -1 for arena rows), or
        None when nothing in it needs hashing."""
        if self.mode == "off" or not (offsets >= 0).any():
            return None
        return self.pack.row_checksums(keys)

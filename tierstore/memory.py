"""The one memory check before a large allocation: work that would need more than half
of this machine's memory is refused with a CapacityError before anything is allocated
(a trace's replay state, a synthetic trace, the prefetcher's co-routing tables)."""

from __future__ import annotations

import os

from tierstore.errors import CapacityError


def check_fits_memory(need: int, what: str) -> None:
    """Refuse (CapacityError starting with ``what``) work that needs more than half of
    this machine's memory, before it allocates anything."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        ram = 0
    if ram and need > ram // 2:
        raise CapacityError(
            f"{what} need {need / 2**30:.1f} GiB, more than half of this "
            f"machine's memory ({ram / 2**30:.1f} GiB)"
        )

"""Formats on disk: the pack file and its sidecar (strict validation of untrusted
headers), the writer, row layouts, FP4 codecs and the builders that make packs."""

from tierstore.format.pack import Pack, VerifyReport, find_pack
from tierstore.format.sidecar import RowLayout, RowSection
from tierstore.format.writer import PackBusyError, PackReplacedError, PackWriter

__all__ = [
    "Pack",
    "PackWriter",
    "PackBusyError",
    "PackReplacedError",
    "RowLayout",
    "RowSection",
    "VerifyReport",
    "find_pack",
]

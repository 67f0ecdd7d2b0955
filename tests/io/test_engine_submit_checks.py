"""Engine.submit refuses bad rows before anything is read: every rejection
reason one line naming the path and the row; nothing is submitted."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import PAGE, eng, write_random_file  # noqa: F401 (eng: a fixture)

from tierstore.errors import ConfigError


@pytest.mark.parametrize(
    "offsets, lengths, src, dst, match",
    [
        ([0, -2], PAGE, None, None, r"row 1 .*file_offset must be >= 0"),
        ([0], 0, None, None, r"row 0 .*length must be in 1\.\.2\^36"),
        ([0], 1 << 40, None, None, r"row 0 .*length must be in 1\.\.2\^36"),  # 1 TiB
        ([0, -1], PAGE, None, None, r"row 1 .*needs a src"),
        ([2**63 - 10], 100, None, None, r"row 0 .*file_offset \+ length overflows"),
        ([0], PAGE, None, [2**64 - 8], r"row 0 .*src/dst \+ length overflows"),
        ([0], -4096, None, None, r"row 0: lengths -4096 is negative"),
        ([0], PAGE, None, [-1], r"row 0: dst_ptrs -1 is negative"),
        ([0], 1.5, None, None, r"lengths must be integers"),
    ],
)
def test_bad_row_is_refused_with_one_line_naming_the_row(eng, offsets, lengths, src, dst, match):
    before = eng.stats()["batches"]
    with pytest.raises(ConfigError, match=match) as info:
        eng.submit(np.array(offsets, dtype=np.int64), lengths, src, dst)
    assert "\n" not in str(info.value) and "[" not in str(info.value)  # no C++ source location
    assert eng.path in str(info.value) or "submit:" in str(info.value)
    assert eng.stats()["batches"] == before  # nothing submitted


def test_good_rows_around_the_checks_still_read(eng):
    buf = eng.alloc_host(2 * PAGE)
    assert eng.submit([0, 15 * PAGE], PAGE, None, buf.data_ptr() + np.array([0, PAGE])).wait()

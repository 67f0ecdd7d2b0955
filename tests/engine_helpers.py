"""Shared helpers for the engine tests: random files of non-zero bytes, row checks."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tierstore.io.engine import Engine

PAGE = 4096


def write_random_file(path, nbytes: int, seed: int = 0) -> np.ndarray:
    """Write nbytes of random non-zero bytes (fsync'ed) and return them."""
    data = np.random.default_rng(seed).integers(1, 256, size=nbytes, dtype=np.uint8)
    with open(path, "wb") as f:
        f.write(data.tobytes())
        f.flush()
        os.fsync(f.fileno())
    return data


def flip_byte(path, at: int) -> None:
    """XOR the byte at ``at`` in place (size kept): a corruption only a checksum can
    tell. A second call restores it."""
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x5A]))


def random_rows(rng: np.random.Generator, file_bytes: int, n: int, max_len: int):
    """n (offset, length) pairs inside the file: half page-aligned, half arbitrary."""
    lengths = rng.integers(1, max_len + 1, size=n)
    offsets = rng.integers(0, file_bytes - lengths + 1)
    aligned = rng.random(n) < 0.5
    offsets = np.where(aligned, offsets // PAGE * PAGE, offsets)
    return offsets.astype(np.int64), lengths.astype(np.int64)


def pack_into(buf_bytes: int, lengths, rng: np.random.Generator, misalign: bool = True):
    """Destination byte positions for rows inside one buffer, some deliberately unaligned."""
    positions, pos = [], 0
    for length in lengths:
        shift = int(rng.integers(0, 64)) if misalign and rng.random() < 0.5 else 0
        pos = (pos + PAGE - 1) // PAGE * PAGE + shift
        positions.append(pos)
        pos += int(length)
    assert pos <= buf_bytes, "destination buffer too small for the rows"
    return np.asarray(positions, dtype=np.int64)


@pytest.fixture
def eng(tmp_path):
    """An engine over a 16-page random file, two threads, buffered reads."""
    path = tmp_path / "rows.bin"
    write_random_file(path, 16 * PAGE, seed=1)
    with Engine(path, threads=2, direct="off") as e:
        yield e

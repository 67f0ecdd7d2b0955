"""The checkpoint identity the upstream vLLM face keys its packs by: it changes when the
experts could have changed (contents, in-place replacement), and only then."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tierstore.adapters import vllm_pack
from tierstore.adapters.vllm_pack import checkpoint_identity


def write_checkpoint(d, size: int, seed: int = 0) -> str:
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write('{"model_type": "mixtral"}')
    data = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()
    path = os.path.join(d, "model.safetensors")
    with open(path, "wb") as f:
        f.write(data)
    return path


def flip_keeping_mtime(path: str, offset: int) -> None:
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_identity_is_stable_and_names_the_directory(tmp_path):
    write_checkpoint(tmp_path / "m", 1 << 16)
    a = checkpoint_identity(str(tmp_path / "m"))
    assert a == checkpoint_identity(str(tmp_path / "m"))
    assert a.startswith("vllm-ckpt-xxh3_128:")


@pytest.mark.parametrize("where", [0, 0.37, 0.5, 0.999])
def test_rot_in_a_small_file_changes_the_identity_even_with_the_mtime_kept(tmp_path, where):
    path = write_checkpoint(tmp_path / "m", 1 << 20)
    a = checkpoint_identity(str(tmp_path / "m"))
    flip_keeping_mtime(path, int(where * ((1 << 20) - 1)))
    assert checkpoint_identity(str(tmp_path / "m")) != a


def test_large_files_are_sampled_and_in_place_replacement_is_caught(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_pack, "WHOLE_BELOW", 1 << 16)  # 1 MiB counts as large
    path = write_checkpoint(tmp_path / "m", 1 << 20)
    a = checkpoint_identity(str(tmp_path / "m"))
    flip_keeping_mtime(path, 0)  # inside the first sample
    b = checkpoint_identity(str(tmp_path / "m"))
    assert b != a
    write_checkpoint(tmp_path / "m", 1 << 20, seed=1)  # replaced, same size
    assert checkpoint_identity(str(tmp_path / "m")) not in (a, b)


def test_other_files_do_not_change_it(tmp_path):
    write_checkpoint(tmp_path / "m", 1 << 12)
    a = checkpoint_identity(str(tmp_path / "m"))
    (tmp_path / "m" / "README.md").write_text("notes")
    assert checkpoint_identity(str(tmp_path / "m")) == a

"""Every hostile sample under tests/data/hostile_packs/ is refused at the stage its
expect.json names, with a one-line error naming the file, and nothing on disk changes.
Regenerate the samples with ``python tests/data/make_hostile_packs.py``."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil

import pytest

from tierstore import FormatError, Pack
from tierstore.cli import main

DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "hostile_packs")
CASES = sorted(os.path.basename(d) for d in glob.glob(os.path.join(DATA, "*")) if os.path.isdir(d))


def _digest(d):
    return {
        n: hashlib.sha256(open(os.path.join(d, n), "rb").read()).hexdigest() for n in sorted(os.listdir(d))
    }


def test_samples_are_present():
    assert len(CASES) >= 20


@pytest.mark.parametrize("case", CASES)
def test_hostile_sample_is_refused_with_named_error(case, tmp_path):
    d = tmp_path / case
    shutil.copytree(os.path.join(DATA, case), d)
    expect = json.load(open(d / "expect.json"))
    packs = sorted(glob.glob(str(d / "*.pack")))
    before = _digest(d)
    with pytest.raises(FormatError, match=expect["error"]) as ei:
        if expect["stage"] == "open_dir":
            Pack.open(d, tag="fp4")
        else:
            with Pack.open(packs[0]) as p:
                assert expect["stage"] == "verify", "opened although it should not"
                p.verify()
    msg = str(ei.value)
    assert "\n" not in msg and (case in msg or str(d) in msg)
    assert _digest(d) == before


@pytest.mark.parametrize("case", ["truncated", "corrupt_row", "not_json", "two_candidates"])
def test_cli_exits_1_on_hostile_sample(case, tmp_path, capsys):
    d = tmp_path / case
    shutil.copytree(os.path.join(DATA, case), d)
    target = str(d) if case == "two_candidates" else sorted(glob.glob(str(d / "*.pack")))[0]
    assert main(["pack", "verify", target]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tierstore: error: ") and err.count("\n") == 1

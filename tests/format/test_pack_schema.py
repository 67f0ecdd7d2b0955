"""docs/pack.schema.json agrees with the msgspec Sidecar: same fields, our sidecars
validate, and hostile samples that a schema can catch are caught."""

from __future__ import annotations

import glob
import json
import os

import pytest

from tierstore.format.build import build_synthetic
from tierstore.format.sidecar import RowLayout, RowSection, Sidecar
from tierstore.testing.packs import make_random_pack

jsonschema = pytest.importorskip("jsonschema")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMA = json.load(open(os.path.join(ROOT, "docs", "pack.schema.json")))
HOSTILE = os.path.join(ROOT, "tests", "data", "hostile_packs")


def _validator():
    return jsonschema.Draft202012Validator(SCHEMA)


def test_schema_fields_match_the_structs():
    assert set(SCHEMA["properties"]) == set(Sidecar.__struct_fields__)
    assert set(SCHEMA["required"]) == {
        f for f in Sidecar.__struct_fields__ if f not in ("layout", "checksum", "checksums")
    }
    assert set(SCHEMA["$defs"]["RowLayout"]["properties"]) == set(RowLayout.__struct_fields__)
    assert set(SCHEMA["$defs"]["RowSection"]["properties"]) == set(RowSection.__struct_fields__)


def test_sidecars_we_write_validate(tmp_path):
    with make_random_pack(tmp_path / "a", 2, 3, 5000, layers=[1]) as p:
        _validator().validate(json.load(open(p.sidecar_path)))
    path, _ = build_synthetic(str(tmp_path / "b"), 1, 2, 6528)
    _validator().validate(json.load(open(path[:-5] + ".json")))


@pytest.mark.parametrize(
    "case",
    [
        "extra_field",
        "missing_stride",
        "string_count",
        "negative_experts",
        "huge_geometry",
        "unknown_checksum_algo",
    ],
)
def test_schema_rejects_hostile_sidecars(case):
    side = json.load(open(glob.glob(os.path.join(HOSTILE, case, "*.rank0of1.json"))[0]))
    assert not _validator().is_valid(side)

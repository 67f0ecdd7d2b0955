"""Numbers given through the environment (issue 41): TIERSTORE_* through the same converters
as the API and the command line (one validation, ``settings``), and vLLM-Moet's
VLLM_MOE_W2_* variables, whose values vLLM-Moet accepts keep its meaning while the ones it
cannot use (nan, inf, 1e400, a file for a directory, a 64 KiB checkpoint id ...) are a
ConfigError naming the variable, at boot, before anything is allocated or written."""

from __future__ import annotations

import math
import os

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from moet_surface_helpers import SLOT, E, env, moet_env, planes

from tierstore import settings
from tierstore.adapters.moet_config import AUTO_VALUES, from_env
from tierstore.errors import CapacityError, ConfigError
from tierstore.testing.moet_engine import MoetEngine

P = "VLLM_MOE_W2_"
NUMERIC_KNOBS = sorted(
    k
    for k, v in settings.KNOBS.items()
    if isinstance(v.default, (int, float)) and not isinstance(v.default, bool)
)


# -- TIERSTORE_*: the environment and the API agree on every number -------------------------
@hsettings(max_examples=300, deadline=None)
@given(
    key=st.sampled_from(NUMERIC_KNOBS),
    value=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(),
        st.integers(min_value=-2, max_value=600),
    ),
)
def test_property_a_setting_takes_the_same_numbers_from_env_and_api(key, value):
    """``TIERSTORE_X=<text of v>`` is accepted exactly when the API accepts ``x=v``, with
    the same value; refused, each names what it was given. (The API also takes 8.0 for a
    count of 8; the environment spells a count as an integer.)"""
    var = settings.KNOBS[key]
    try:
        api = settings.argument(key, value, var.parse)
    except ConfigError as exc:
        api = exc
    text = repr(value) if isinstance(value, float) else str(value)
    if isinstance(var.default, int) and isinstance(value, float) and value.is_integer():
        text = str(int(value))  # a count is written as one in the environment ("8", not "8.0")
    try:
        from_env = settings.check_environment({var.env: text})[key]
    except ConfigError as exc:
        assert isinstance(api, ConfigError), (key, value, api)
        assert str(exc).startswith(f"{var.env}=") and "\n" not in str(exc)
        assert f"{key} must be" in str(api)
        return
    assert not isinstance(api, ConfigError), (key, value, str(api))
    assert from_env == api == var.parse(value)


@pytest.mark.parametrize("key", NUMERIC_KNOBS)
@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e400", "", "0x10", "1,5", "ten"])
def test_a_bad_number_in_a_tierstore_variable_names_it(key, text):
    env_name = settings.KNOBS[key].env
    with pytest.raises(ConfigError, match=rf"^{env_name}="):
        settings.check_environment({env_name: text})


# -- VLLM_MOE_W2_*: vLLM-Moet's meaning where it accepts a value, a named refusal where not --
REFUSED = [
    ("DELTA_GB", "inf"),
    ("DELTA_GB", "1e400"),
    ("DELTA_GB", "nan"),
    ("DELTA_GB", "-inf"),
    ("DELTA_GB", "1e10"),
    ("NUM_LAYERS", "1000000000"),
    ("NUM_LAYERS", "65536"),
    ("NUM_LAYERS", "-1"),
    ("DELTA_PROMOTE", "-1"),
    ("DELTA_PROMOTE", "1e9"),
    ("DELTA_PROMOTE", "99999999999"),
    ("DELTA_TICK_MS", "1e300"),
    ("DELTA_TICK_MS", "60001"),
    ("DELTA_TICK_MS", "nan"),
    ("DELTA_RESERVE_GB", "1e300"),
    ("DELTA_RESERVE_GB", "-1"),
    ("DELTA_MAX_GB", "nan"),
    ("DELTA_MAX_GB", "inf"),
    ("TIERSTORE_RAM_GB", "1e300"),
    ("TIERSTORE_RAM_GB", "-2"),
    ("DELTA_DECAY", "nan"),
    ("DELTA_DECAY_S", "inf"),
    ("PROMO_HYST", "nan"),
    ("BASE_CACHE_GB", "inf"),
    ("STORE_THREADS", "nan"),
    ("CKPT_ID", "c" * 65537),
    ("CKPT_ID", '"' * 40000),  # 80,000 bytes once JSON-escaped
    ("STORE_DIR", "/dev/null"),
]


@pytest.mark.parametrize("name, value", REFUSED, ids=[f"{n}={v[:12]}" for n, v in REFUSED])
def test_a_value_vllm_moet_cannot_use_is_refused_naming_the_variable(name, value):
    with pytest.raises(ConfigError) as ei:
        from_env({P + name: value})
    msg = str(ei.value)
    assert msg.startswith(f"{P}{name}=") and "\n" not in msg and len(msg) < 400, msg[:500]


@pytest.fixture
def odd_paths(tmp_path):
    f = tmp_path / "a-file"
    f.write_text("x")
    fifo = tmp_path / "a-fifo"
    os.mkfifo(fifo)
    link = tmp_path / "to-a-file"
    link.symlink_to(f)
    return {"a regular file": f, "a FIFO": fifo, "a regular file ": link, "a character device": "/dev/null"}


def test_store_dir_naming_a_file_fifo_or_device_is_refused_at_parse(odd_paths):
    for what, path in odd_paths.items():
        with pytest.raises(ConfigError, match=rf"STORE_DIR={path}: not a directory \({what.strip()}\)"):
            from_env({P + "STORE_DIR": str(path)})


@pytest.mark.parametrize(
    "name, value, field, meaning",
    [
        ("DELTA_GB", "1e6", "delta_gb", 1e6),  # any finite GiB: vLLM-Moet's size
        ("DELTA_GB", "-5", "delta_gb", -5.0),  # <= 0: no FP4 tier
        ("DELTA_MAX_GB", "-3", "max_gb", 0.0),  # <= 0: no cap, as vLLM-Moet's
        ("DELTA_TICK_MS", "1000", "tick_s", 1.0),
        ("DELTA_TICK_MS", "-5", "tick_s", -0.005),  # no rate limit
        ("DELTA_PROMOTE", "100000", "promote_per_pass", 100000),
        ("STORE_THREADS", "0", "store_threads", 1),  # clamped up to 1, as vLLM-Moet's
        ("STORE_THREADS", "100000", "store_threads", 512),  # and down to the engine's cap
        ("NUM_LAYERS", "65535", "num_layers", 65535),
        ("CKPT_ID", "c" * 65536, "ckpt_id", "c" * 65536),
        ("GATE_MAX_PROMOTE", "99999999999999999999", "gate_max_promote", 99999999999999999999),
    ],
)
def test_values_vllm_moet_accepts_keep_its_meaning(name, value, field, meaning):
    assert getattr(from_env({P + name: value}), field) == meaning


@hsettings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from(AUTO_VALUES),
        st.integers(min_value=-(2**40), max_value=2**40),
    )
)
def test_property_delta_gb_is_vllm_moets_size_or_a_named_refusal(gb):
    text = gb if isinstance(gb, str) else repr(gb)
    try:
        e = from_env({P + "DELTA_GB": text})
    except ConfigError as exc:
        assert isinstance(gb, (int, float)) and (not math.isfinite(gb) or gb > 2**30), gb
        assert str(exc).startswith(f"{P}DELTA_GB=")
        return
    if isinstance(gb, str) or text in AUTO_VALUES:
        assert e.delta_auto and e.initial_slots(SLOT) == 0
        return
    assert math.isfinite(gb) and gb <= 2**30 and e.delta_gb == float(text)  # any <= 0: no tier
    assert e.enabled == (gb > 0)
    if gb > 0:  # vLLM-Moet's own arithmetic: max(int(GiB * 2^30) // slot, 8)
        assert e.initial_slots(SLOT) == max(int(float(text) * 2**30) // SLOT, 8)


# -- through the face: refused at boot, before anything is allocated or written --------------
def test_a_huge_num_layers_is_refused_before_the_slot_table(monkeypatch, tmp_path):
    """65535 main-stack layers x 256 experts: more keys than a pack may hold; refused
    before a [65536, 256] table (or a pack) is made."""
    with moet_env(monkeypatch, env(tmp_path, NUM_LAYERS=65535)) as m:
        with pytest.raises(ConfigError, match=r"over a pack's limit .*VLLM_MOE_W2_NUM_LAYERS"):
            m.get_tier(n_experts=256, dev="cpu")
        assert m._TIER is None and os.listdir(tmp_path) == []


def test_delta_gb_beyond_the_pack_serves_every_key_or_names_delta_gb(monkeypatch, tmp_path):
    """1e6 GiB: vLLM-Moet's slot count capped by the keys that exist (a pool of every key),
    then the store's memory check: a pool that fits serves; one that does not is a
    CapacityError naming DELTA_GB, never an allocation error."""
    e = env(tmp_path)
    e[P + "DELTA_GB"] = "1e6"
    with moet_env(monkeypatch, e) as m:
        eng = MoetEngine(m, planes(), n_experts=E, dev="cpu", top_k=2, tokens=2).boot()
        eng.step(fire=True)
        assert m._TIER.n_slots == len(planes()) * E  # every key of the 3 x 16 pack
    import tierstore.store.sizing as sizing

    monkeypatch.setattr(sizing, "device_available_bytes", lambda device: 4 * SLOT)  # a small host
    with moet_env(monkeypatch, e) as m:
        with pytest.raises(CapacityError, match=r"^VLLM_MOE_W2_DELTA_GB=1e6: .*finalize"):
            MoetEngine(m, planes(), n_experts=E, dev="cpu", top_k=2, tokens=2).boot()


def test_a_long_ckpt_id_is_refused_before_a_pack_is_written(tmp_path):
    from tierstore.format.writer import PackWriter

    with pytest.raises(ConfigError, match="field `ckpt_id`: 70000 bytes as JSON, over the cap"):
        PackWriter(tmp_path / "p", tag="fp4", n_layers=2, n_experts=4, slot_bytes=4096, ckpt_id="k" * 70000)
    assert not (tmp_path / "p").exists() or os.listdir(tmp_path / "p") == []

"""TIERSTORE_* knobs: defaults, environment, set/override, docs/SETTINGS.md agreement."""
from __future__ import annotations

import pathlib

import pytest

from tierstore import settings
from tierstore.errors import ConfigError

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "SETTINGS.md"


@pytest.fixture(autouse=True)
def fresh_settings():
    settings.reset()
    yield
    settings.reset()


def test_every_knob_is_documented_once_with_its_variable_and_default():
    text = DOC.read_text()
    for name, env, default, _doc in settings.describe():
        rows = [line for line in text.splitlines() if line.startswith(f"| `{name}` |")]
        assert len(rows) == 1, f"{name}: {len(rows)} rows in SETTINGS.md"
        assert f"`{env}`" in rows[0]
        cell = rows[0].split("|")[3].strip()
        assert settings.KNOBS[name].parse(cell) == default, f"{name}: documented default {cell!r}"


def test_environment_is_read_and_parsed(monkeypatch):
    monkeypatch.setenv("TIERSTORE_THREADS", "3")
    monkeypatch.setenv("TIERSTORE_DIRECT", "ON")
    assert settings.get("threads") == 3 and settings.get("direct") == "on"


@pytest.mark.parametrize("env, value, expect", [
    ("TIERSTORE_THREADS", "0", "expected an integer >= 1"),
    ("TIERSTORE_DIRECT", "sometimes", "expected auto, on or off"),
    ("TIERSTORE_SCAN_KEEP", "1.5", "fraction in"),
])
def test_bad_environment_value_names_the_variable(monkeypatch, env, value, expect):
    monkeypatch.setenv(env, value)
    name = env[len("TIERSTORE_"):].lower()
    with pytest.raises(ConfigError, match=rf"\${env}: .*{expect}"):
        settings.get(name)


def test_override_restores_previous_value_even_on_error():
    settings.set("lazy_per_step", 5)
    with pytest.raises(RuntimeError):
        with settings.override(lazy_per_step=1, threads=2):
            assert settings.get("lazy_per_step") == 1 and settings.get("threads") == 2
            raise RuntimeError("boom")
    assert settings.get("lazy_per_step") == 5 and settings.get("threads") == 8


def test_unknown_knob_and_bad_set_value_raise_config_error():
    with pytest.raises(ConfigError, match="unknown setting 'thread'"):
        settings.get("thread")
    with pytest.raises(ConfigError, match="setting max_promote"):
        settings.set("max_promote", -1)

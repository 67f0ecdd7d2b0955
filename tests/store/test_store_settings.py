"""TIERSTORE_* knobs: defaults, environment, set/override, docs/SETTINGS.md agreement."""

from __future__ import annotations

import pathlib
import re
import warnings

import pytest

from tierstore import settings
from tierstore.errors import ConfigError

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "SETTINGS.md"


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


@pytest.mark.parametrize(
    "env, value, expect",
    [
        ("TIERSTORE_THREADS", "0", "expected an integer >= 1 and <= 512"),  # the engine's cap
        ("TIERSTORE_DIRECT", "sometimes", "unknown O_DIRECT mode 'sometimes'; expected one of auto, on, off"),
        ("TIERSTORE_SCAN_KEEP", "1.5", "expected a fraction in [0, 1]"),
        ("TIERSTORE_POOL_POLICY", "foo", "unknown policy 'foo'; expected one of lru, heat, hybrid"),
    ],
)
def test_bad_environment_value_names_the_variable(monkeypatch, env, value, expect):
    monkeypatch.setenv(env, value)
    name = env[len("TIERSTORE_") :].lower()
    with pytest.raises(ConfigError, match=rf"^{env}={value}: {re.escape(expect)}"):
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


def test_all_bad_variables_are_reported_together(monkeypatch):
    monkeypatch.setenv("TIERSTORE_THREADS", "many")
    monkeypatch.setenv("TIERSTORE_ARENA_POLICY", "arc")
    with pytest.raises(ConfigError) as info:
        settings.get("lazy_per_step")  # any knob: the family is parsed as a whole
    assert len(info.value.problems) == 2
    assert "TIERSTORE_THREADS=many" in str(info.value) and "TIERSTORE_ARENA_POLICY=arc" in str(info.value)
    monkeypatch.delenv("TIERSTORE_THREADS")
    monkeypatch.delenv("TIERSTORE_ARENA_POLICY")
    settings.reset()
    assert settings.get("lazy_per_step") == 8


def test_unknown_variable_warns_once_and_names_it(monkeypatch):
    spec = settings.EnvSpec("TIERSTORE_", settings.SPEC.vars.values())
    env = {"TIERSTORE_THREDS": "4", "TIERSTORE_THREADS": "4", "OTHER": "x"}
    with pytest.warns(RuntimeWarning, match="TIERSTORE_THREDS"):
        assert spec.parse(env)["threads"] == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spec.parse(env)  # once per process and name


def test_the_test_suites_own_switches_are_not_reported_as_unknown():
    spec = settings.EnvSpec("TIERSTORE_", settings.SPEC.vars.values())
    env = {"TIERSTORE_TEST_REQUIRE_VLLM": "1", "TIERSTORE_TEST_ANYTHING": "x"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spec.parse(env)
    assert spec.unknown({"TIERSTORE_TESTX": "1"}) == ["TIERSTORE_TESTX"]  # only the exact prefix


def test_a_command_under_ci_s_environment_still_answers_in_one_line(tmp_path):
    # .ci/run sets TIERSTORE_TEST_REQUIRE_VLLM=1 for the whole pytest run, and every
    # subprocess inherits it: a warning line would break the one-line error contract.
    import os
    import subprocess
    import sys

    from cli_process import child_env

    env = child_env(TIERSTORE_TEST_REQUIRE_VLLM="1")
    missing = tmp_path / "fp4.rank0of1.pack"
    os.mkfifo(missing)  # refused only after the pack reader (which reads the settings) ran
    p = subprocess.run(
        [sys.executable, "-m", "tierstore", "pack", "inspect", str(missing)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode != 0 and len(lines) == 1 and str(tmp_path) in lines[0], p.stderr


def test_policy_names_match_the_policy_registry():
    from tierstore import policies

    assert tuple(policies.available()) == settings.POLICY_NAMES


def test_spec_is_reusable_for_another_family():
    spec = settings.EnvSpec(
        "APP_",
        [
            settings.Var("APP_N", "n", settings.integer(0, 9), 1, "a digit"),
            settings.Var("APP_GB", "gb", settings.gib_or_auto, None, "GiB or auto"),
            settings.Var("APP_ON", "on", settings.boolean, True, "switch"),
            settings.Var("APP_MODE", "mode", settings.choice("a", "b", aliases={"1": "a"}), "a", "mode"),
        ],
        family="APP",
    )
    assert spec.parse({}) == {"n": 1, "gb": None, "on": True, "mode": "a"}
    assert spec.parse({"APP_GB": "2.5", "APP_MODE": "1"}, defaults=False) == {"gb": 2.5, "mode": "a"}
    with pytest.raises(
        ConfigError,
        match=r"^3 bad APP variables: APP_N=10: expected an integer >= 0 "
        r"and <= 9; APP_GB=-1: expected GiB >= 0 and <= 1073741824, or auto; "
        r"APP_ON=maybe: expected 0/1/true/false$",
    ) as info:
        spec.parse({"APP_N": "10", "APP_GB": "-1", "APP_ON": "maybe"})
    assert [p.split("=")[0] for p in info.value.problems] == ["APP_N", "APP_GB", "APP_ON"]


@pytest.mark.parametrize("raw", ["nan", "inf", "-0.5", "", "1e400", "0x10"])
def test_numbers_reject_non_finite_and_out_of_range(raw):
    with pytest.raises(ValueError):
        settings.number(0.0)(raw)
    with pytest.raises(ValueError):
        settings.integer(1)(raw)

"""Argument parsing shared by the command modules."""
from __future__ import annotations

from tierstore.errors import ConfigError


def int_list(text: str, name: str) -> list[int]:
    """``"51,102,205"`` -> ``[51, 102, 205]``; a ConfigError naming ``--name`` otherwise."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--{name}: expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise ConfigError(f"--{name}: expected positive integers, got {text!r}")
    return values

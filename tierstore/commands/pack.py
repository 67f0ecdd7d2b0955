"""Placeholder: `tierstore ... pack` sub-commands (being built)."""
from __future__ import annotations


def register(sub) -> None:
    pass

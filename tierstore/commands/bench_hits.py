"""Placeholder: `tierstore ... bench_hits` sub-commands (being built)."""
from __future__ import annotations


def register(sub) -> None:
    pass

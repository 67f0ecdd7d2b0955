"""Placeholder: `tierstore demo` (being built)."""
from __future__ import annotations


def register(groups) -> None:
    p = groups.add_parser("demo", help="the main job, end to end, on a small generated model")
    p.set_defaults(func=lambda args: print("demo: not yet built") or 1)

"""Tests use the store's public names only: no file under tests/ touches a private
attribute of an ExpertStore (``store._pool``, ``getattr(store, "_mover")``,
``monkeypatch.setattr(store, "_stage_now", ...)``). What a test needs to see is public:
``store.tier("pool" | "arena")``, ``resident_keys``, ``stats``, ``check_invariants``,
``batches_in_flight``, ``sections_open``, ``worker_alive`` (tierstore/store/inspection.py).

The private names are the store's own: its class attributes, an instance's attributes
and every ``self._x = ...`` in the classes it is made of (set later, on demand), so the
scan flags those names and no other class's privates. A module's private (``os._exit``)
is not a store's."""

from __future__ import annotations

import ast
import inspect
import pathlib
import textwrap

import pytest

import tierstore as ts
from tierstore.store.expert_store import ExpertStore
from tierstore.testing.packs import make_random_pack

TESTS = pathlib.Path(__file__).resolve().parent
ATTR_CALLS = {"getattr", "setattr", "hasattr", "delattr"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


@pytest.fixture(scope="module")
def store_privates(tmp_path_factory) -> frozenset:
    pack = make_random_pack(tmp_path_factory.mktemp("names"), 2, 4, 3000, seed=1)
    with ts.ExpertStore(pack, vram_slots=2, ram_gb=2 * 4096 / 2**30, device="cpu") as store:
        names = {n for n in vars(store) if _private(n)}
    own = [c for c in ExpertStore.__mro__ if c.__module__.startswith("tierstore.")]
    for cls in own:
        names |= {n for n in vars(cls) if _private(n)}
        for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(cls)))):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and _private(node.attr)
            ):
                names.add(node.attr)
    assert {"_pool", "_arena", "_mover", "_journal", "_worker"} <= names
    return frozenset(names)


def private_uses(source: str, names: frozenset) -> list[tuple[int, str]]:
    """(line, expression) of every use of one of ``names`` as an attribute in
    ``source``: ``x._name`` (x not an imported module) or ``getattr(x, "_name")``,
    ``setattr``/``hasattr``/``delattr``, ``monkeypatch.setattr(x, "_name", ...)``."""
    tree = ast.parse(source)
    modules = {
        (a.asname or a.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for a in node.names
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in names:
            if not (isinstance(node.value, ast.Name) and node.value.id in modules):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            fn = node.func
            called = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else None
            arg = node.args[1]
            if called in ATTR_CALLS and isinstance(arg, ast.Constant) and arg.value in names:
                found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def test_the_scan_finds_each_way_of_reaching_a_store_private(store_privates):
    source = textwrap.dedent("""
        import os
        store._pool.slot_of[3]
        self.store._mover.inflight
        getattr(es, "_arena")
        monkeypatch.setattr(es, "_stage_now", slow)
        os._exit(0)                      # a module's private: not the store's
        t._tag, p._resident              # other classes' privates
        store.tier("pool").slot_of(3)
    """)
    assert [line for line, _ in private_uses(source, store_privates)] == [3, 4, 5, 6]


def test_no_test_touches_a_private_attribute_of_the_store(store_privates):
    bad = [
        f"{path.relative_to(TESTS.parent)}:{line}: {expr}"
        for path in sorted(TESTS.rglob("*.py"))
        for line, expr in private_uses(path.read_text(), store_privates)
    ]
    assert not bad, (
        "tests reach into ExpertStore privates; use store.tier(...), "
        "resident_keys, stats or check_invariants instead:\n" + "\n".join(bad)
    )

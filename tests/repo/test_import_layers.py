"""The library and its commands never import the test kits (README: "never imported by
the library or the demo"): read from the source, so a lazy import inside a function
counts too."""

from __future__ import annotations

import ast
import pathlib

import tierstore

PACKAGE = pathlib.Path(tierstore.__file__).parent


def _imports(path: pathlib.Path):
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from ((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module, node.lineno
            yield from ((f"{node.module}.{a.name}", node.lineno) for a in node.names)


def test_no_product_module_imports_the_test_kits():
    bad = [
        f"{p.relative_to(PACKAGE.parent)}:{line} imports {name}"
        for p in sorted(PACKAGE.rglob("*.py"))
        if "testing" not in p.relative_to(PACKAGE).parts
        for name, line in _imports(p)
        if name == "tierstore.testing" or name.startswith("tierstore.testing.")
    ]
    assert not bad, "\n".join(bad)

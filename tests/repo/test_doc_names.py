"""Docs and docstrings name things that exist.

Read from the source, nothing imported but the command's parser and the native module:
- every ``tierstore.x.y`` dotted name (and ``module:attr`` entry point) in docs/*.md, the
  README, bench/*.md, and the docstrings and error / warning messages of every module
  under tierstore/ resolves to a module, or a top-level name (or a class member) of one;
- every ``tierstore <command> [<subcommand>] [--flag ...]`` written as code resolves in the
  real argparse tree, flags included;
- every repository path (``tierstore/compute/moe.py``, ``bench/device/``, ``results/x.json``,
  a bare ``prefetcher.cpp`` or ``DESIGN.md``) exists in this checkout;
- no doc, docstring or product comment cites an "issue N" of a tracker the repository does
  not carry: the reason is written out instead.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import os
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Files the name check skips (none: every doc and docstring names what exists).
EXCLUDED: list[str] = []

_SKIP_DIRS = {
    ".git",
    "build",
    "__pycache__",
    ".pytest_cache",
    ".hypothesis",
    ".ruff_cache",
    ".benchmarks",
    ".baseline",
    ".whl",
    ".venv-vllm-cpu",
}
# Files of vLLM-Moet, named where a doc compares with it (they are in its repository).
EXTERNAL = {"moe_w2_store.py", "moe_w2_gate.py", "moe_w2_delta.py", "MOET-SURFACE.md"}
_CODE_EXT = ("py", "cpp", "hpp", "h", "cu", "cuh", "sh", "cmake")
_PATH_EXT = _CODE_EXT + ("md", "json", "toml", "txt", "png", "npy", "pack", "yml", "yaml", "pyx")


def _excluded(rel: str) -> bool:
    return any(fnmatch.fnmatch(rel, pat) for pat in EXCLUDED)


@cache
def _repo_files() -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """(relative paths, relative directories, basenames) of the checkout."""
    files, dirs, names = set(), set(), set()
    for here, subdirs, fnames in os.walk(ROOT):
        subdirs[:] = [d for d in subdirs if d not in _SKIP_DIRS]
        rel = os.path.relpath(here, ROOT)
        if rel != ".":
            dirs.add(rel.replace(os.sep, "/"))
        for f in fnames:
            files.add(os.path.join(rel, f).replace(os.sep, "/").removeprefix("./"))
            names.add(f)
    return frozenset(files), frozenset(dirs), frozenset(names)


# -- the texts ---------------------------------------------------------------------------


def _markdown_sources() -> list[str]:
    out = ["README.md", "bench/README.md", "bench/RESULTS.md"]
    out += sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))
    return [p for p in out if (ROOT / p).exists() and not _excluded(p)]


def _python_sources() -> list[str]:
    return sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "tierstore").rglob("*.py")
        if not _excluded(str(p.relative_to(ROOT)))
    )


def _docstrings(rel: str):
    """(line, text) of the module's, its classes' and its functions' docstrings."""
    tree = ast.parse((ROOT / rel).read_text(), filename=rel)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield (node.body[0].lineno, doc)


def _messages(rel: str):
    """(line, text) of the error and warning messages a module raises: the string parts
    of every ``raise`` and ``warnings.warn(...)``."""
    tree = ast.parse((ROOT / rel).read_text(), filename=rel)
    for node in ast.walk(tree):
        is_warn = isinstance(node, ast.Call) and (
            getattr(node.func, "attr", None) == "warn" or getattr(node.func, "id", None) == "warn"
        )
        if isinstance(node, ast.Raise) or is_warn:
            parts = [
                n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            ]
            if parts:
                yield node.lineno, "".join(parts)


def _texts():
    """(where, text, is_markdown) of every checked text."""
    for rel in _markdown_sources():
        yield rel, (ROOT / rel).read_text(), True
    for rel in _python_sources():
        for line, doc in _docstrings(rel):
            yield f"{rel}:{line}", doc, False
        for line, msg in _messages(rel):
            yield f"{rel}:{line}", msg, False


_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_SPAN = re.compile(r"``(.+?)``|`([^`\n]+)`")


_PROMPT = re.compile(r"^\s*(?:\$ |python3? -m )?(?=tierstore )")


def _code(text: str, markdown: bool) -> list[str]:
    """The parts of ``text`` written as code that may hold a command: spans, and the lines
    of fenced or indented blocks that start with one (prose lines may begin "tierstore")."""
    parts = [m.group(1) or m.group(2) for m in _SPAN.finditer(_FENCE.sub("", text))]
    fenced = "\n".join(m.group(0) for m in _FENCE.finditer(text))
    indent = 4 if markdown else 2  # a docstring's examples are indented within it
    lines = fenced.splitlines() + [
        ln for ln in _FENCE.sub("", text).splitlines() if ln.startswith(" " * indent)
    ]
    parts += [ln for ln in lines if _PROMPT.match(ln)]
    return parts


# -- dotted names ------------------------------------------------------------------------

_DOTTED = re.compile(r"(?<![\w./-])tierstore(?:\.[A-Za-z_]\w*)+(?::[A-Za-z_]\w*)?")


def _module_file(mod: str) -> Path | None:
    base = ROOT.joinpath(*mod.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


@cache
def _top_names(path: Path) -> dict[str, ast.AST | None]:
    """Names bound at a module's top level (classes map to their node, for members)."""
    names: dict[str, ast.AST | None] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = None
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        names[n.id] = None
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                names[(a.asname or a.name).split(".")[0]] = None
        elif isinstance(node, (ast.If, ast.Try)):  # `if TYPE_CHECKING:` / try-import blocks
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    for a in sub.names:
                        names[(a.asname or a.name).split(".")[0]] = None
                elif isinstance(sub, (ast.FunctionDef, ast.ClassDef)):
                    names.setdefault(sub.name, None)
    return names


@cache
def _strings(path: Path) -> frozenset[str]:
    return frozenset(
        n.value
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    )


def _class_members(node: ast.ClassDef) -> set[str]:
    out = set()
    for sub in node.body:
        if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(sub.name)
        elif isinstance(sub, (ast.Assign, ast.AnnAssign)):
            targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
            out |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    for fn in ast.walk(node):  # self.x = ... in any method
        if (
            isinstance(fn, ast.Attribute)
            and isinstance(fn.value, ast.Name)
            and fn.value.id == "self"
            and isinstance(fn.ctx, ast.Store)
        ):
            out.add(fn.attr)
    return out


def _has(obj, attrs: list[str]) -> bool:
    for attr in attrs:
        if not hasattr(obj, attr):
            return False
        obj = getattr(obj, attr)
    return True


def _resolves(name: str) -> bool:
    parts = name.replace(":", ".").split(".")
    for cut in range(len(parts), 0, -1):
        mod = ".".join(parts[:cut])
        rest = parts[cut:]
        if mod == "tierstore._C":
            from tierstore import _C

            return _has(_C, rest)
        path = _module_file(mod)
        if path is None:
            continue
        if not rest:
            return True
        node = _top_names(path)
        if rest[0] not in node and "__getattr__" in node:
            # a lazy name (tierstore.Pack): the module's __getattr__ looks it up by its
            # string; read, not imported (importing an adapter would import vLLM)
            return len(rest) == 1 and rest[0] in _strings(path)
        if rest[0] not in node:
            # a submodule imported lazily (``from tierstore.x import y`` inside a function)
            return _module_file(f"{mod}.{rest[0]}") is not None and _resolves(f"{mod}.{'.'.join(rest)}")
        cls = node[rest[0]]
        if len(rest) == 1:
            return True
        if isinstance(cls, ast.ClassDef):
            return len(rest) == 2 and rest[1] in _class_members(cls)
        return _module_file(f"{mod}.{rest[0]}") is not None and _resolves(f"{mod}.{'.'.join(rest)}")
    return False


# -- commands ----------------------------------------------------------------------------

# the words of a command, then its arguments up to a comment or a nested "$(...)"
_COMMAND = re.compile(r"(?<![\w.$/-])tierstore((?: +[a-z][a-z0-9-]*)+)((?: +(?!\"?\$\()[^\s#]+)*)")
_NOT_A_COMMAND = re.compile(r"(import|from|install|-m|python3?|pip)\s+$")


@cache
def _parser():
    from tierstore.cli import build_parser

    return build_parser()


def _subparsers(p) -> dict:
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            return a.choices
    return {}


def _command_problem(words: list[str], rest: str) -> str | None:
    p, used = _parser(), []
    for w in words:
        subs = _subparsers(p)
        if not subs:
            break  # a positional argument (a path, a count)
        if w not in subs:
            return f"'tierstore {' '.join(used + [w])}': no such command"
        p = subs[w]
        used.append(w)
    if _subparsers(p):
        return None  # `tierstore bench` alone names the group
    known = {o for a in p._actions for o in a.option_strings}
    for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", " ".join(words) + rest):
        if flag not in known:
            return f"'tierstore {' '.join(used)}' has no option {flag}"
    return None


# -- paths -------------------------------------------------------------------------------

_PATH = re.compile(r"(?<![\w/.<{$~*-])((?:[A-Za-z0-9_.-]+/)+(?:[A-Za-z0-9_.-]+)?)(?![\w/<{*-])")
_BARE = re.compile(
    r"(?<![\w/.<{$~*-])([A-Za-z0-9_-]+\.(?:" + "|".join(_CODE_EXT) + r")|[A-Z][A-Z0-9_-]+\.md)(?![\w/<{*])"
)


def _path_exists(token: str, where: str) -> bool:
    files, dirs, _ = _repo_files()
    token = token.rstrip(".,;:)")
    doc_dir = os.path.dirname(where.split(":")[0])
    for base in ("", doc_dir, "tierstore", "csrc", "bench", "tests", "docs"):
        cand = os.path.normpath(os.path.join(base, token)).replace(os.sep, "/")
        if cand in files or cand.rstrip("/") in dirs:
            return True
    return False


def _is_path(token: str) -> bool:
    token = token.rstrip(".,;:)")
    # absolute, the user's own directory (./out.png), outside the checkout, or a URL
    if (
        "://" in token or token.startswith(("/", "./", "../", "~")) or "//" in token or "..." in token
    ):  # an elided path (csrc/store/.../x.hpp)
        return False
    last = token.rsplit("/", 1)[-1]
    if not last:
        # a directory: only ones that name a room of the checkout, not prose like "and/or/"
        return token.split("/")[0] in {
            "tierstore",
            "csrc",
            "bench",
            "tests",
            "docs",
            "examples",
            "results",
            "device",
        }
    return "." in last and last.rsplit(".", 1)[-1] in _PATH_EXT


# -- the tests ---------------------------------------------------------------------------


def _problems() -> list[str]:
    bad = []
    for where, text, markdown in _texts():
        for m in _DOTTED.finditer(text):
            if not _resolves(m.group(0)):
                bad.append(f"{where}: {m.group(0)} does not exist")
        for code in _code(text, markdown):
            for m in _COMMAND.finditer(code):
                if _NOT_A_COMMAND.search(code[: m.start()]):
                    continue
                problem = _command_problem(m.group(1).split(), m.group(2))
                if problem:
                    bad.append(f"{where}: {problem}")
        for m in _PATH.finditer(text):
            if (
                _is_path(m.group(1))
                and not _path_exists(m.group(1), where)
                and m.group(1).rsplit("/", 1)[-1] not in EXTERNAL
            ):
                bad.append(f"{where}: {m.group(1)} is not in the repository")
        _, _, names = _repo_files()
        for m in _BARE.finditer(text):
            if m.group(1) not in names and m.group(1) not in EXTERNAL:
                bad.append(f"{where}: {m.group(1)} is not in the repository")
    return sorted(set(bad))


def test_docs_and_docstrings_name_modules_commands_and_files_that_exist():
    bad = _problems()
    assert not bad, f"{len(bad)} names that do not exist:\n" + "\n".join(bad)


_ISSUE = re.compile(r"\bissues? +#?\d+", re.I)


def test_no_issue_numbers_of_a_tracker_the_repository_does_not_carry():
    files = _markdown_sources() + _python_sources()
    files += sorted(
        str(p.relative_to(ROOT))
        for ext in ("cpp", "hpp", "h", "cu", "cuh")
        for p in (ROOT / "csrc").rglob(f"*.{ext}")
    )
    files += sorted(str(p.relative_to(ROOT)) for p in (ROOT / "bench").glob("*.py"))
    bad = [
        f"{rel}:{n}: {line.strip()[:100]}"
        for rel in files
        if not _excluded(rel)
        for n, line in enumerate((ROOT / rel).read_text().splitlines(), 1)
        if _ISSUE.search(line)
    ]
    assert not bad, "write the reason, not the issue number:\n" + "\n".join(bad)


# -- the checker itself ------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, ok",
    [
        ("tierstore.store.expert_store.ExpertStore", True),
        ("tierstore.store.expert_store.ExpertStore.fire", True),
        ("tierstore.Pack", True),
        ("tierstore.sim.traces", True),
        ("tierstore.warmstart.WarmStartWarning", False),  # the module was never there
        ("tierstore.store_io", False),
        ("tierstore.store.expert_store.ExpertStore.no_such_method", False),
        ("tierstore.compute.moe.no_such_function", False),
    ],
)
def test_dotted_name_check_tells_real_from_missing(name, ok):
    assert _resolves(name) is ok


@pytest.mark.parametrize(
    "words, rest, ok",
    [
        (["bench", "fire"], " --dir D --sizes 1,8", True),
        (["demo"], " --quick --json", True),
        (["pack", "verify"], " out/", True),
        (["bench", "replay"], "", False),  # no such subcommand
        (["bench", "fire"], " --no-such-flag", False),
        (["warmstart"], "", False),
    ],
)
def test_command_check_follows_the_real_parser(words, rest, ok):
    assert (_command_problem(words, rest) is None) is ok


@pytest.mark.parametrize(
    "token, ok",
    [
        ("tierstore/compute/moe.py", True),
        ("bench/device/prelude.sh", True),
        ("policies/blend.py", True),  # package-relative
        ("tierstore/warm_formats.py", False),
        ("bench/no_such.py", False),
    ],
)
def test_path_check(token, ok):
    assert _path_exists(token, "README.md") is ok

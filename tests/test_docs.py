"""The docs' code references do not go stale (issue 39 item 7).

1. Every Python file path named in docs/*.md (not docs/history/, which records what was), README.md,
   BENCHMARKS.md and RELIABILITY.md exists. A path is a run of `dir/.../name.py` (at least one directory, not part
   of a longer path, URL or placeholder such as `<checkout>/x.py`) whose first directory exists at the repo root or
   under engramctl/; it must exist relative to the one its first directory is in (`tests/factory.py`,
   `scripts/soak.py`, `engramctl/store/store.py`, `store/store.py`, `engine/llama_pool.py`). Shorthand whose first
   part is no directory (`snapshots_read/_rm/_change.py`) is not a path.

2. docs/architecture.md's file-and-name pairs name something that exists in that file, read with ast (the file is
   not imported). A pair is a backticked file followed by a backticked name, nothing but spaces between them:

       `store/sessions.py` `Sessions.branch`      `cli/connect.py` `connect()`      `listing.py` `StoreSource`
       `daemon/worker.py` `Worker.submit(..., turn=True)`

   - the file: a path as in 1, or a bare file name, which must name exactly one file under engramctl/;
   - `Name`, `Name()` or `Name(args)`: a top-level def, class or assigned name of the file, or else the method of
     exactly one class in it (`client/api.py` `branch_snapshot()` is `Client.branch_snapshot`);
   - `Name.attr[.attr]` (with or without a call): `Name` a top-level class, each `attr` a def, class or assigned or
     annotated name directly in the body of the class before it, or (the last one) an attribute its own methods
     assign on `self` (`self.attr = ...`, `self.attr: T = ...`).

   Dotted module paths (`store.sessions.branch`) and names separated from their file by any other text are not
   pairs and are not checked.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "engramctl"
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / name for name in ("README.md", "BENCHMARKS.md", "RELIABILITY.md")]
ARCHITECTURE = ROOT / "docs" / "architecture.md"

PATH = re.compile(r"(?<![\w./<>-])((?:[\w-]+/)+[\w-]+\.py)(?![\w/])")
PAIR = re.compile(r"`([\w./-]+\.py)` +`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:\([^`]*\))?`")

# Pairs in docs/architecture.md that are stale today (file, name): none. Add one only for a reference that is
# wrong in the doc's text, never to pass a test that found a real drift after a change to the code.
STALE_TODAY: set[tuple[str, str]] = set()


def _base(path: str) -> Path | None:
    """The directory a doc's path is relative to: the repo root or engramctl/, whichever holds its first part."""
    first = path.split("/", 1)[0]
    for base in (ROOT, PACKAGE):
        if (base / first).is_dir():
            return base
    return None


def doc_paths() -> list[tuple[str, int, str]]:
    """(doc, line number, path) for every Python file path the docs name."""
    found = []
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            for m in PATH.finditer(line):
                if _base(m.group(1)) is not None:
                    found.append((doc.relative_to(ROOT).as_posix(), number, m.group(1)))
    return found


def test_every_python_path_the_docs_name_exists():
    paths = doc_paths()
    assert len(paths) > 100, "the path pattern found almost nothing: is it still the docs' way of writing paths?"
    missing = [f"{doc}:{number}: {path}" for doc, number, path in paths if not (_base(path) / path).is_file()]
    assert not missing, "paths named in the docs that do not exist:\n" + "\n".join(missing)


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _instance_attributes(cls: ast.ClassDef) -> set[str]:
    """The attributes a class's own methods assign on `self`."""
    out = set()
    for method in cls.body:
        if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) and method.args.args:
            me = method.args.args[0].arg
            for node in ast.walk(method):
                targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
                for t in targets:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == me:
                        out.add(t.attr)
    return out


def _names(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """What a module or class body binds: defs, classes, assigned and annotated names."""
    out: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
    return out


def resolve_file(written: str) -> Path | str:
    """The file a pair names, or why it names none."""
    if "/" in written:
        base = _base(written)
        if base is None or not (base / written).is_file():
            return "no such file"
        return base / written
    matches = sorted(PACKAGE.rglob(written))
    if len(matches) != 1:
        return f"a bare file name must name one file under engramctl/, {written} names {len(matches)}"
    return matches[0]


def missing_name(path: Path, name: str) -> str | None:
    """Why `name` names nothing in the file, or None when it does."""
    module = _names(_tree(path).body)
    first, *attrs = name.split(".")
    if not attrs:
        if first in module:
            return None
        owners = [
            c.name
            for c in _tree(path).body
            if isinstance(c, ast.ClassDef)
            and isinstance(_names(c.body).get(first), ast.FunctionDef | ast.AsyncFunctionDef)
        ]
        if len(owners) == 1:
            return None
        return f"no top-level {first}" + (f", and {len(owners)} classes define it" if owners else "")
    node = module.get(first)
    for i, attr in enumerate(attrs):
        if not isinstance(node, ast.ClassDef):
            return f"{'.'.join([first, *attrs[:i]])} is not a class here"
        owner, node = node, _names(node.body).get(attr)
        if node is None and i == len(attrs) - 1 and attr in _instance_attributes(owner):
            return None
        if node is None:
            return f"{'.'.join([first, *attrs[:i]])} has no {attr}"
    return None


def architecture_pairs() -> list[tuple[int, str, str]]:
    text = ARCHITECTURE.read_text()
    return [(text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2)) for m in PAIR.finditer(text)]


def test_architecture_names_what_its_files_define():
    pairs = architecture_pairs()
    assert len(pairs) > 20, "the pair pattern found almost nothing: is it still the doc's way of naming code?"
    stale = []
    for line, written, name in pairs:
        if (written, name) in STALE_TODAY:
            continue
        path = resolve_file(written)
        why = path if isinstance(path, str) else missing_name(path, name)
        if why:
            stale.append(f"docs/architecture.md:{line}: `{written}` `{name}`: {why}")
    assert not stale, "references in docs/architecture.md that name nothing:\n" + "\n".join(stale)


@pytest.mark.parametrize(
    ("source", "name", "names_something"),
    [
        ("class A:\n    def m(self): ...\n", "A.m", True),
        ("class A:\n    x: int = 0\n", "A.x", True),
        ("class A:\n    def m(self): ...\n", "m", True),  # a method of exactly one class
        ("class A:\n    def m(self): ...\nclass B:\n    def m(self): ...\n", "m", False),  # of two: ambiguous
        ("def f(): ...\n", "f", True),
        ("LIMIT = 3\n", "LIMIT", True),
        ("def f(): ...\n", "g", False),
        ("class A:\n    def m(self): ...\n", "A.n", False),
        ("def f(): ...\n", "f.x", False),  # a function has no attributes here
        ("class A:\n    def m(self):\n        self.x = 1\n", "A.x", True),  # set by its own method
        ("class A:\n    def m(self):\n        self.x = 1\n", "A.x.y", False),  # not followed further
        ("class A: ...\nclass B:\n    def m(self):\n        self.x = 1\n", "A.x", False),  # another class's
    ],
)
def test_the_name_rules(tmp_path, source, name, names_something):
    path = tmp_path / "m.py"
    path.write_text(source)
    assert (missing_name(path, name) is None) == names_something


def test_the_patterns():
    assert [
        m.group(1) for m in PATH.finditer("see tests/factory.py, x/../y.py, /tmp/a/b.py, <c>/d.py and a/b.pyc")
    ] == ["tests/factory.py"]
    found = [m.groups() for m in PAIR.finditer("`a/b.py` `C.d()` and `e.py` `f(x, y=1)`, `g.py` then `h`")]
    assert found == [("a/b.py", "C.d"), ("e.py", "f")]

"""The layers import downwards only, and no module imports itself back through others.

Every `import`/`from ... import` of every engramctl module is read from its source (ast), including the
ones inside functions (lazy imports are still dependencies) and those under `if TYPE_CHECKING:` (they never
run, but a module that names another's types depends on it as much: a cycle held apart only by TYPE_CHECKING
is still a cycle). A new upward import, or a cycle, fails here naming the file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "engramctl"

# Top to bottom. A module may import its own package's modules and anything in a lower layer; packages
# that share a layer are peers and do not import each other.
LAYERS: list[tuple[str, ...]] = [
    ("engramctl.__main__",),
    ("engramctl.cli",),  # the CLI, and `engramctl mcp`'s server (a daemon client)
    ("engramctl.client", "engramctl.bench"),  # the daemon's HTTP client; benchmarks run the daemon's turn
    ("engramctl.daemon",),  # routes, the conversation service, agent-tool dispatch
    ("engramctl.agent",),  # agent tool definitions and the model's tool-call parsing
    ("engramctl.engine",),
    ("engramctl.ngram",),
    ("engramctl.state",),
    ("engramctl.store",),
    ("engramctl.tiers",),
    ("engramctl.protocol", "engramctl.settings", "engramctl.pidlock"),  # vocabulary, stdlib only
    ("engramctl.paths",),  # where the files are: the settings' paths, and all a listing of the index needs
    ("engramctl.units",),
    ("engramctl.errors",),
    ("engramctl",),  # the package itself: __version__
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(module: str, path: Path) -> list[tuple[str, int]]:
    """(imported engramctl module, line) for every import in the file, lazy ones and TYPE_CHECKING ones included."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.extend((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from engramctl.daemon import runner` imports the module engramctl.daemon.runner
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES]
            found.extend((t, node.lineno) for t in (subs or [target]))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return [(t, line) for t, line in found if t == "engramctl" or t.startswith("engramctl.")]


IMPORTS = {m: _imports(m, p) for m, p in MODULES.items()}


def _layer(module: str) -> tuple[int, str]:
    """(layer index, the package that places it): the longest prefix named in LAYERS."""
    best: tuple[int, str] | None = None
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and (best is None or len(name) > len(best[1])):
                best = (i, name)
    if best is None:
        raise AssertionError(f"{module} is in no layer: add its package to LAYERS in {__file__}")
    return best


def test_every_module_is_placed_and_lazy_imports_are_read():
    assert len(MODULES) > 50 and "engramctl.daemon.app" in MODULES
    for module in MODULES:
        _layer(module)
    # `engramctl mcp` imports its server inside the command function
    assert "engramctl.cli.mcp_server" in {t for t, _ in IMPORTS["engramctl.cli.mcp"]}


def test_imports_point_down_only():
    upward = []
    for module, imports in IMPORTS.items():
        level, package = _layer(module)
        for target, line in imports:
            target_level, target_package = _layer(target)
            if target_package == package:
                continue  # within a package (cycles are the next test's)
            if target_level <= level:
                upward.append(
                    f"{MODULES[module].relative_to(PACKAGE.parent)}:{line} {module} imports {target} "
                    f"({target_package} is {'a peer' if target_level == level else 'above'})"
                )
    assert not upward, "imports must point down the layers:\n" + "\n".join(upward)


def test_no_import_cycles():
    graph = {m: sorted({t for t, _ in imps if t in MODULES and t != m}) for m, imps in IMPORTS.items()}
    cycles, state = [], {}  # state: 1 = on the current path, 2 = done

    def walk(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in graph[m]:
            if state.get(t) == 1:
                cycles.append(" -> ".join(path[path.index(t) :] + [t]) if t in path else f"{m} -> {t}")
            elif t not in state:
                walk(t, path + [t])
        state[m] = 2

    for m in graph:
        if m not in state:
            walk(m, [m])
    assert not cycles, "import cycles (lazy and TYPE_CHECKING imports count):\n" + "\n".join(cycles)


def test_the_checks_see_imports_under_type_checking(tmp_path):
    """An import only type checkers run is a dependency too: a cycle through one is a cycle."""
    path = tmp_path / "m.py"
    path.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from engramctl.daemon.service import X\n")
    assert [t for t, _ in _imports("engramctl.daemon.scheduler", path)] == ["engramctl.daemon.service"]


@pytest.mark.parametrize(
    "source,wrong",
    [
        ("from engramctl.daemon.app import create_app\n", "engramctl.engine.fake"),
        ("def f():\n    from engramctl.cli import output\n", "engramctl.client"),
    ],
)
def test_the_checks_see_lazy_and_upward_imports(tmp_path, source, wrong):
    """The scanner itself: an import inside a function counts, and an upward one is recognised."""
    path = tmp_path / "m.py"
    path.write_text(source)
    ((target, _),) = _imports(wrong, path)
    assert _layer(target)[0] < _layer(wrong)[0]

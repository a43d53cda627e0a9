"""The import graph: the layers import downward only, no circle, and no project import hides
in a function without saying why.

The graph is read from the syntax tree of every module of ``pipeline/``, ``storage_schema/``,
``jobs/`` and ``flows/``, imports inside functions included (they run later, but a circle
through them is still a circle, and a hidden one). An edge is what importing a module runs:

* ``import a.b.c`` or ``from a.b import c`` (``c`` a submodule): ``a.b.c``, and each package
  above it that is not a package of the importing module (Python runs ``a/__init__`` and
  ``a/b/__init__`` first; a package's own ``__init__`` is already running when it imports
  its submodules, so an ``__init__`` that re-exports its submodules is no circle);
* ``from a.b import name`` (``name`` not a submodule): the package ``a.b`` itself, even from
  inside ``a.b``: a submodule that reads its own package's names, while that package's
  ``__init__`` imports it, is a circle;
* a package that imports names on first use (``__getattr__``: its ``_LAZY`` table, an
  ``importlib.import_module("...")``) has an edge to each module it would import;
* relative imports resolve the same way; imports under ``if TYPE_CHECKING:`` are left out
  (they never run).

Layers: pipeline <- storage_schema <- jobs <- flows; pipeline imports neither zarr, Dask
nor Prefect, and only flows imports Prefect (every import counted, TYPE_CHECKING ones too).

Deferred imports: a project import inside a function is allowed only where it keeps a heavy
library (torch, timm, scikit-learn, scipy, matplotlib, Prefect, Dask, the dataset adapters
and PIL) off an import path that must stay light (the CLI's start, the protocol registry,
the report without plots, a long-lived process). It says so with a ``# deferred: <why>``
comment on its own line, or on the comment line directly above the run of import
statements it belongs to (one comment for a group).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.code import PACKAGES, REPO

DEFERRED = "# deferred:"
NOT_IN = {"pipeline": ("zarr", "dask", "distributed", "prefect"), "storage_schema": ("prefect",),
          "jobs": ("prefect",)}


@dataclass(frozen=True)
class Import:
    """One import statement of a module: what it runs, where it is."""

    module: str  # the importing module
    path: Path
    line: int
    end_line: int
    targets: tuple[str, ...]  # dotted names as written (submodule or package, resolved below)
    top: tuple[str, ...]  # the top-level package of each name imported (project or not)
    in_function: bool


def modules(root: Path, packages: tuple[str, ...]) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package) of every module of ``packages`` under ``root``."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


@functools.lru_cache(maxsize=None)
def _parsed(path: Path) -> tuple[list[str], ast.Module]:
    text = path.read_text()
    return text.splitlines(), ast.parse(text, str(path))


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for s in node.body for n in ast.walk(s))
    return skipped


def _walk(node: ast.AST, in_function: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    for child in ast.iter_child_nodes(node):
        inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        yield child, inside
        yield from _walk(child, inside)


def imports(root: Path, packages: tuple[str, ...], type_checking: bool = False) -> Iterator[Import]:
    """Every import statement of the packages' modules (those under TYPE_CHECKING only when asked)."""
    known = modules(root, packages)
    for name, (path, is_package) in known.items():
        tree = _parsed(path)[1]
        skipped = set() if type_checking else _type_checking_nodes(tree)
        for node, in_function in _walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                written = tuple(a.name for a in node.names)
                tops = tuple(w.split(".")[0] for w in written)
                yield Import(name, path, node.lineno, node.end_lineno, written, tops, in_function)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = name.split(".") if is_package else name.split(".")[:-1]
                    base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else []))
                written = tuple(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names)
                yield Import(name, path, node.lineno, node.end_lineno, written, (base.split(".")[0],), in_function)


def _lazy_targets(path: Path, package: str) -> set[str]:
    """The modules a package's ``__getattr__`` imports on first use."""
    tree = _parsed(path)[1]
    found = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets):
            for value in ast.literal_eval(node.value).values():
                found.add(value if value.split(".")[0] == package.split(".")[0] else f"{package}.{value}")
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            for call in ast.walk(node):
                if (isinstance(call, ast.Call) and ast.unparse(call.func).endswith("import_module")
                        and call.args and isinstance(call.args[0], ast.Constant)):
                    found.add(call.args[0].value)
    return found


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, dict[str, int]]:
    """Module -> {module it runs on import: the line that does}, as the docstring says."""
    known = modules(root, packages)

    def resolve(name: str) -> str:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, dict[str, int]] = {name: {} for name in known}
    for imp in imports(root, packages):
        own = {imp.module.rsplit(".", k)[0] for k in range(imp.module.count(".") + 1)}
        for target in imp.targets:
            found = resolve(target)
            if not found:
                continue
            parts = found.split(".")
            runs = [".".join(parts[:k]) for k in range(1, len(parts))]
            for module in [m for m in runs if m not in own] + [found]:
                if module != imp.module and module in known:
                    graph[imp.module].setdefault(module, imp.line)
    for name, (path, is_package) in known.items():
        if is_package:
            for target in _lazy_targets(path, name):
                if resolve(target):
                    graph[name].setdefault(resolve(target), 0)
    return graph


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(graph[nxt])))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _describe(component: list[str], graph: dict[str, dict[str, int]]) -> str:
    edges = [f"  {a} -> {b} ({f'line {graph[a][b]}' if graph[a][b] else 'on first use'})"
             for a in component for b in sorted(graph[a]) if b in component]
    return f"circle of {len(component)} modules: {', '.join(component)}\n" + "\n".join(edges)


def undeclared_deferrals(root: Path, packages: tuple[str, ...]) -> list[str]:
    """``path:line: import`` of each in-function project import without its ``# deferred:`` comment."""
    found = list(imports(root, packages, type_checking=True))
    import_lines: dict[Path, set[int]] = {}
    for imp in found:
        import_lines.setdefault(imp.path, set()).update(range(imp.line, imp.end_line + 1))
    bad = []
    for imp in found:
        if not imp.in_function or not set(imp.top) & set(packages):
            continue
        lines = _parsed(imp.path)[0]
        if any(DEFERRED in line for line in lines[imp.line - 1:imp.end_line]):
            continue
        above = imp.line - 1  # 1-based: the line above the statement
        while above in import_lines[imp.path]:
            above -= 1  # up the run of imports it belongs to
        comment = []
        while above >= 1 and lines[above - 1].lstrip().startswith("#"):
            comment.append(lines[above - 1].lstrip())
            above -= 1
        if not any(c.startswith(DEFERRED) for c in comment):
            bad.append(f"{imp.path.relative_to(root)}:{imp.line}: {lines[imp.line - 1].strip()}")
    return bad


def test_packages_import_no_circle() -> None:
    graph = import_graph(REPO, PACKAGES)
    found = circles(graph)
    assert not found, "\n\n".join(_describe(c, graph) for c in found)


def test_layers_import_downward_only() -> None:
    wrong = []
    for imp in imports(REPO, PACKAGES, type_checking=True):
        layer = imp.module.split(".")[0]
        above = PACKAGES[PACKAGES.index(layer) + 1:]  # the layers it may not import
        for top in imp.top:
            if top in above or top in NOT_IN.get(layer, ()):
                wrong.append(f"{imp.path.relative_to(REPO)}:{imp.line}: {layer} imports {top}")
    assert not wrong, "\n".join(wrong)


def test_every_import_in_a_function_says_why_it_is_deferred() -> None:
    bad = undeclared_deferrals(REPO, PACKAGES)
    assert not bad, (f"a project import inside a function without a '{DEFERRED} <why>' comment (import it at "
                     "module level unless it keeps a heavy library off a light import path):\n" + "\n".join(bad))


def test_the_checks_find_a_planted_circle_and_an_undeclared_deferral(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "from pkg.a import A\n",
        "pkg/a.py": "A = 1\n\ndef f():\n    from pkg.b import B\n    return B\n",
        "pkg/b.py": "from pkg import A\nB = A\n",  # reads its package's names while pkg/__init__ imports a
        "pkg/c.py": "def g():\n    # deferred: a heavy library\n    from pkg.a import A\n    from pkg.b import B\n"
                    "    return A, B\n",
        "pkg/d.py": "from pkg import a, b\n",  # submodules: no edge to pkg's own __init__
        "other/__init__.py": "",
        "other/e.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.e import E\n"
                      "import pkg.d\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path, ("pkg", "other"))
    assert circles(graph) == [["pkg", "pkg.a", "pkg.b"]]
    assert set(graph["pkg.d"]) == {"pkg.a", "pkg.b"}
    assert set(graph["other.e"]) == {"pkg", "pkg.d"}  # importing pkg.d runs pkg/__init__ first
    assert undeclared_deferrals(tmp_path, ("pkg", "other")) == ["pkg/a.py:4: from pkg.b import B"]

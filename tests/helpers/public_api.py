"""The public API: what a user imports or a config names, read from the source (nothing imported).

The docstring rule (docs/development.md, "Docstrings") holds exactly these definitions to
numpydoc:

* every name in the ``__all__`` of a package ``__init__.py`` of the four layers, followed
  through re-exports and lazy ``_LAZY`` tables to where it is defined;
* the dataset adapters (classes decorated ``@register_dataset``) and the protocols'
  estimators (classes of ``pipeline/protocols/`` deriving from scikit-learn's
  ``BaseEstimator``): a config names them;
* the ``repeval`` command's entry point (``[project.scripts]`` of ``pyproject.toml``);
* whatever README.md and docs/*.md tell a user to import (``from x import a, b``);
* ``NAMED``: the run's spine, which the lead's code and tests drive (``jobs.run.spine``).

A class counts with its public methods. Names bound to values (constants) are part of the
API but have no docstring to check.
"""

from __future__ import annotations

import ast
import re
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tests.helpers.code import PACKAGES, REPO, python_files

#: Public definitions no rule above finds: ``module:qualified name``.
NAMED = ("jobs.run.spine:Run", "jobs.run.spine:RunSummary")

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


@dataclass(frozen=True)
class Definition:
    """A public definition: its module's file, its name in the module and why it is public."""

    path: Path
    name: str
    why: str


def _module_path(module: str) -> Path | None:
    base = REPO.joinpath(*module.split("."))
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _lazy_table(tree: ast.Module) -> dict[str, str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets) \
                and isinstance(node.value, ast.Dict):
            return {k.value: v.value for k, v in zip(node.value.keys, node.value.values)
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)}
    return {}


def _imported_modules(tree: ast.Module) -> list[str]:
    """``importlib.import_module("x.y")`` targets of a module (a package's lazy ``__getattr__``)."""
    return [n.args[0].value for n in ast.walk(tree) if isinstance(n, ast.Call) and n.args
            and ast.unparse(n.func).endswith("import_module") and isinstance(n.args[0], ast.Constant)]


def resolve(module: str, name: str, seen: frozenset[str] = frozenset()) -> tuple[Path, ast.AST] | None:
    """Where ``module.name`` is bound: (file, its top-level def or assignment), or None."""
    path = _module_path(module)
    if path is None or module in seen:
        return None
    tree = _tree(path)
    for node in tree.body:
        if isinstance(node, _DEFS) and node.name == name:
            return path, node
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t)):
            return path, node
    seen = seen | {module}
    for node in ast.walk(tree):  # re-exported, at the top, under TYPE_CHECKING or in __getattr__
        if isinstance(node, ast.ImportFrom) and node.module and any(a.name == name for a in node.names):
            package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
            source = node.module if node.level == 0 else \
                ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1], node.module])
            return resolve(source, name, seen)
    lazy = _lazy_table(tree)
    if name in lazy:
        target = lazy[name]
        full = target if target.split(".")[0] in PACKAGES else f"{module}.{target}"
        return resolve(full, name, seen)
    for target in _imported_modules(tree):
        found = resolve(target, name, seen)
        if found is not None:
            return found
    return None


def _exported() -> list[tuple[str, str, str]]:
    out = []
    for pkg in PACKAGES:
        for path in python_files(pkg):
            if path.name != "__init__.py":
                continue
            module = ".".join(path.relative_to(REPO).parent.parts)
            for node in _tree(path).body:
                if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__"
                                                        for t in node.targets):
                    names = [c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)
                             and isinstance(c.value, str)]
                    names += list(_lazy_table(_tree(path))) if "_LAZY" in ast.unparse(node.value) else []
                    out += [(module, n, f"{module}.__all__") for n in names]
    return out


def _classes_where(folder: str, keep) -> list[tuple[str, str, str]]:
    out = []
    for path in python_files(folder):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for node in _tree(path).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_") and keep(node):
                out.append((module, node.name))
    return out


def _adapters() -> list[tuple[str, str, str]]:
    def registered(cls: ast.ClassDef) -> bool:
        return any(ast.unparse(d).startswith("register_dataset(") for d in cls.decorator_list)
    return [(m, n, "a registered dataset adapter") for m, n in _classes_where("pipeline/datasets", registered)]


def _estimators() -> list[tuple[str, str, str]]:
    bases: dict[str, list[str]] = {}
    for path in python_files("pipeline"):
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ClassDef):
                bases.setdefault(node.name, []).extend(ast.unparse(b).split(".")[-1].split("[")[0]
                                                       for b in node.bases)

    def estimator(name: str, seen: frozenset[str] = frozenset()) -> bool:
        return name == "BaseEstimator" or any(b not in seen and estimator(b, seen | {name})
                                              for b in bases.get(name, ()))
    return [(m, n, "a protocol estimator") for m, n in
            _classes_where("pipeline/protocols", lambda cls: estimator(cls.name))]


def _scripts() -> list[tuple[str, str, str]]:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"].get("scripts", {})
    return [(*target.split(":"), f"the `{command}` command") for command, target in scripts.items()]


def _documented_imports() -> list[tuple[str, str, str]]:
    out = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        for module, names in re.findall(r"from ((?:%s)[\w.]*) import (\w+(?:,\s*\w+)*)" % "|".join(PACKAGES), text):
            out += [(module, n.strip(), f"imported in {page.relative_to(REPO)}")
                    for n in names.split(",") if n.strip().isidentifier()]
    return out


@cache
def public_names() -> tuple[tuple[str, str, str], ...]:
    """(module, name, why) of every public name, in the order of the rules above."""
    named = [(*entry.split(":"), "named in tests/helpers/public_api.py") for entry in NAMED]
    return tuple([*_exported(), *_adapters(), *_estimators(), *_scripts(), *_documented_imports(), *named])


@cache
def unresolved() -> tuple[str, ...]:
    """Public names that are bound nowhere in the source (a stale ``__all__`` or doc)."""
    return tuple(f"{m}.{n} ({why})" for m, n, why in public_names() if resolve(m, n) is None)


@cache
def _classes() -> dict[str, list[tuple[Path, ast.ClassDef]]]:
    out: dict[str, list[tuple[Path, ast.ClassDef]]] = {}
    for pkg in PACKAGES:
        for path in python_files(pkg):
            for node in _tree(path).body:
                if isinstance(node, ast.ClassDef):
                    out.setdefault(node.name, []).append((path, node))
    return out


def _bases(name: str, seen: set[str]) -> None:
    for _, node in _classes().get(name, []):
        for base in node.bases:
            base_name = ast.unparse(base).split(".")[-1].split("[")[0]
            if base_name in _classes() and base_name not in seen:
                seen.add(base_name)
                _bases(base_name, seen)


@cache
def public_definitions() -> dict[Path, dict[str, str]]:
    """File -> {name of a public top-level function or class defined there: why it is public}.

    A base class of a public class (defined in the four layers) is listed too, with a reason
    starting ``a base of``: its public methods are the public class's (only they are checked).
    """
    out: dict[Path, dict[str, str]] = {}
    for module, name, why in public_names():
        found = resolve(module, name)
        if found is not None and isinstance(found[1], _DEFS):
            out.setdefault(found[0], {}).setdefault(name, why)
    public = {name for names in out.values() for name in names}
    for name in sorted(public):
        bases: set[str] = set()
        _bases(name, bases)
        for base in sorted(bases - public):
            for path, _ in _classes()[base]:
                out.setdefault(path, {}).setdefault(base, f"a base of {name}")
    return out

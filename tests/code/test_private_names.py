"""No module reaches another module's or package's private names.

An underscored name (``_helper``, ``sklearn.utils._param_validation``) is an
implementation detail: it changes without notice, so code that imports it breaks on an
upgrade, and a helper two modules need deserves a public name. Checked on the syntax tree
of every module of the packages and the benchmarks:

* ``from M import _name`` and ``import M._private`` / ``from M._private import name``;
* ``X._name`` where ``X`` was bound by an import (a module or an imported object).

A package may keep private modules (a name with a leading underscore) for its own modules;
nothing outside that package may import them.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.code import REPO, SOURCE_DIRS, module_name, python_files


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@dataclass(frozen=True)
class Violation:
    path: Path
    line: int
    what: str

    def __str__(self) -> str:
        where = self.path.relative_to(REPO) if self.path.is_relative_to(REPO) else self.path
        return f"{where}:{self.line}: {self.what}"


def _resolve(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    """The absolute module name of a (possibly relative) ``from`` import."""
    if not node.level:
        return node.module or ""
    parts = importer.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _private_module_allowed(module: str, importer: str) -> bool:
    """A private module may be imported from inside the package that holds it."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if _private(part):
            owner = ".".join(parts[:i])
            return bool(owner) and (importer == owner or importer.startswith(owner + "."))
    return True


def violations(path: Path, importer: str | None = None) -> list[Violation]:
    """Every reach into another module's private names in one source file."""
    importer = importer or module_name(path)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[Violation] = []
    imported: set[str] = set()  # names bound by imports: modules and imported objects
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not _private_module_allowed(alias.name, importer):
                    found.append(Violation(path, node.lineno, f"import of private module {alias.name}"))
                imported.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(node, importer, is_package)
            if not _private_module_allowed(module, importer):
                found.append(Violation(path, node.lineno, f"import from private module {module}"))
            for alias in node.names:
                if _private(alias.name) and not importer.startswith(module + "."):  # a package's own
                    found.append(Violation(path, node.lineno, f"import of private name {module}.{alias.name}"))
                imported.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in imported:
                found.append(Violation(path, node.lineno, f"use of private name {ast.unparse(node)}"))
    return found


@pytest.mark.parametrize("folder", SOURCE_DIRS)
def test_no_private_names_from_other_modules(folder: str) -> None:
    found = [v for path in python_files(folder) for v in violations(path)]
    assert not found, "private names reached across modules:\n" + "\n".join(map(str, found))


def test_the_check_finds_each_kind_of_reach(tmp_path: Path) -> None:
    """The rule itself, on planted code: each kind is found, allowed forms are not."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import flows.runtime\n"
        "import timm.models._builder\n"
        "from sklearn.utils._param_validation import Interval\n"
        "from jobs.extraction.extract import _run\n"
        "from pipeline.protocols._validation import check_labels\n"  # allowed: same package
        "from pipeline.datasets._hashing import register_dataset\n"  # another package's private module
        "from . import _validation\n"  # allowed: the package's own private module
        "x = flows.runtime._helper\n"
        "y = Interval._private_attr\n"
        "z = self_made._private\n"  # not bound by an import: allowed
        "w = __name__\n"
    )
    found = [v.what for v in violations(sample, importer="pipeline.protocols.sample")]
    assert found == [
        "import of private module timm.models._builder",
        "import from private module sklearn.utils._param_validation",
        "import of private name jobs.extraction.extract._run",
        "import from private module pipeline.datasets._hashing",
        "use of private name flows.runtime._helper",
        "use of private name Interval._private_attr",
    ]

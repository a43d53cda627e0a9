"""The public API documents its parameters and returns (numpydoc); nothing else is held to it.

The public API is what a user imports or a config names, derived in one place
(``tests/helpers/public_api.py``; docs/development.md, "Docstrings", states the rule). Each
of its functions and classes, and each public method of its classes, needs a docstring; one
that takes parameters needs a ``Parameters`` section naming each of them (a class documents
its constructor's, a dataclass its fields, there or as ``Attributes``); one annotated to return a value needs a
``Returns`` (or ``Yields``) section. Properties and dunder methods need only the docstring of
what they are. A method without a docstring of its own that overrides a documented method of
a base class inherits that documentation (``help()`` and ``inspect.getdoc`` show it), so it
passes. A private helper, or any definition outside the public API, may have a one-line
docstring, a comment saying why, or nothing: only each module's header is required.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

from tests.helpers.code import PACKAGES, REPO, module_name, python_files
from tests.helpers.public_api import public_definitions, unresolved


def _public(name: str) -> bool:
    return not name.startswith("_")


def _section(doc: str, title: str) -> str | None:
    """The body of a numpydoc section (``Title`` underlined with dashes), or None."""
    lines = doc.splitlines()
    for i, line in enumerate(lines[:-1]):
        if line.strip() == title and set(lines[i + 1].strip()) == {"-"}:
            body = []
            for later, nxt in zip(lines[i + 2:], [*lines[i + 3:], ""]):
                if nxt.strip() and set(nxt.strip()) == {"-"} and later.strip():
                    break  # the next section's title
                body.append(later)
            return "\n".join(body)
    return None


def _documented_names(section: str) -> set[str]:
    """Parameter names of a Parameters section: its unindented ``a, b : type`` / ``**kwargs`` lines."""
    names = set()
    for line in section.splitlines():
        if line.strip() and not line[0].isspace():
            names.update(n.strip().lstrip("*") for n in line.split(" : ")[0].split(","))
    return names


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> list[str]:
    args = fn.args
    names = [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]
    if method and names and names[0] in ("self", "cls"):
        names = names[1:]
    if args.vararg:
        names.append(args.vararg.arg)
    if args.kwarg:
        names.append(args.kwarg.arg)
    return names


def _returns_value(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    ret = fn.returns
    return ret is not None and not (isinstance(ret, ast.Constant) and ret.value is None) and \
        ast.unparse(ret) not in ("None", "NoReturn", "Never")


def _decorators(node: ast.AST) -> set[str]:
    return {ast.unparse(d).split("(")[0] for d in getattr(node, "decorator_list", [])}


def _check_parameters(doc: str, params: list[str], where: str, problems: list[str],
                      fields: bool = False) -> None:
    if not params:
        return
    section = _section(doc, "Parameters")
    if section is None and fields:  # a dataclass may list its fields as Attributes
        section = _section(doc, "Attributes")
    if section is None:
        problems.append(f"{where}: no Parameters section for {', '.join(params)}")
        return
    missing = [p for p in params if p not in _documented_names(section)]
    if missing:
        problems.append(f"{where}: Parameters section lacks {', '.join(missing)}")


def _check_function(fn, where: str, method: bool, problems: list[str]) -> None:
    doc = ast.get_docstring(fn)
    decorators = _decorators(fn)
    if not doc:
        problems.append(f"{where}: no docstring")
        return
    if decorators & {"property", "cached_property", "functools.cached_property"} or \
            any(d.endswith((".setter", ".deleter")) for d in decorators):
        return
    params = _parameters(fn, method)
    _check_parameters(doc, params, where, problems)
    if _returns_value(fn) and fn.name != "__init__" and _section(doc, "Returns") is None \
            and _section(doc, "Yields") is None:
        problems.append(f"{where}: no Returns section")


def _class_parameters(cls: ast.ClassDef) -> list[str]:
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init is not None:
        return _parameters(init, method=True)
    if any(d.startswith(("dataclass", "dataclasses.dataclass")) for d in _decorators(cls)):
        return [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                and "ClassVar" not in ast.unparse(n.annotation)]
    return []


@cache
def _documented_methods() -> dict[str, tuple[frozenset[str], tuple[str, ...]]]:
    """Class name -> (its methods with a docstring, its base classes' names), over the
    four packages (classes are matched by name)."""
    out: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {}
    for folder in PACKAGES:
        for path in python_files(folder):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.ClassDef):
                    documented = frozenset(n.name for n in node.body if isinstance(
                        n, (ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(n))
                    bases = tuple(ast.unparse(b).split(".")[-1].split("[")[0] for b in node.bases)
                    out.setdefault(node.name, (documented, bases))
    return out


def _inherits_doc(bases: tuple[str, ...], method: str, seen: frozenset[str] = frozenset()) -> bool:
    known = _documented_methods()
    for base in bases:
        if base in seen or base not in known:
            continue
        documented, parents = known[base]
        if method in documented or _inherits_doc(parents, method, seen | {base}):
            return True
    return False


def _check_class(cls: ast.ClassDef, where: str, problems: list[str], methods_only: bool = False) -> None:
    if not methods_only:
        doc = ast.get_docstring(cls)
        if not doc:
            problems.append(f"{where}: no docstring")
            return
        dataclass = any(d.startswith(("dataclass", "dataclasses.dataclass")) for d in _decorators(cls))
        _check_parameters(doc, _class_parameters(cls), where, problems, fields=dataclass)
    bases = tuple(ast.unparse(b).split(".")[-1].split("[")[0] for b in cls.bases)
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _public(node.name):
            if not ast.get_docstring(node) and _inherits_doc(bases, node.name):
                continue  # an override: the base method's documentation applies
            _check_function(node, f"{where}.{node.name}", method=True, problems=problems)


def problems_of(path: Path, public: dict[str, str] | None = None) -> list[str]:
    """Every missing docstring or section of one module's public API definitions.

    Parameters
    ----------
    path : pathlib.Path
        The module's file.
    public : dict or None
        Its public definitions: name -> why (``public_definitions()``); None: every
        top-level definition whose name has no leading underscore.

    Returns
    -------
    list of str
        One line per problem, ``path:line name: what is missing``.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    where = path.relative_to(REPO) if path.is_relative_to(REPO) else path.name
    problems: list[str] = []
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        why = public.get(node.name) if public is not None else "" if _public(node.name) else None
        if why is None:
            continue
        if isinstance(node, ast.ClassDef):
            _check_class(node, f"{where}:{node.lineno} {node.name}", problems, why.startswith("a base of"))
        else:
            _check_function(node, f"{where}:{node.lineno} {node.name}", method=False, problems=problems)
    return problems


def test_every_public_name_is_defined() -> None:
    assert not unresolved(), "public names bound nowhere in the source:\n" + "\n".join(unresolved())


def test_the_public_api_holds_what_users_import_and_configs_name() -> None:
    public = {name for names in public_definitions().values() for name in names}
    for name in ("FeatureStore", "load_config", "results_frame", "main", "LogisticProbe", "KNNClassifier",
                 "ImageFolderDataset", "Cifar10Dataset", "transfer_correlation", "Run", "RunSummary", "write_report"):
        assert name in public
    assert "make_plan" not in public and "_FeatureTransform" in public  # a base: its public methods are the API


@pytest.mark.parametrize("path", sorted(public_definitions()), ids=module_name)
def test_public_api_has_numpydoc_docstrings(path: Path) -> None:
    problems = problems_of(path, public_definitions()[path])
    assert not problems, "public API definitions without numpydoc:\n" + "\n".join(problems)


def test_every_module_says_what_it_holds() -> None:
    missing = [str(p.relative_to(REPO)) for pkg in PACKAGES for p in python_files(pkg)
               if p.read_text().strip() and not ast.get_docstring(ast.parse(p.read_text()))]
    assert not missing, "modules without a header docstring:\n" + "\n".join(missing)


def test_the_check_reads_numpydoc_sections(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('''
def good(a, b, *rest, flag=False, **extra) -> int:
    """Add.

    Parameters
    ----------
    a, b : int
        Numbers.
    *rest : int
        More.
    flag : bool
        A flag.
    **extra
        Ignored.

    Returns
    -------
    int
        The sum.
    """


def no_returns(a) -> int:
    """Doc.

    Parameters
    ----------
    a : int
        A.
    """


def lacks_b(a, b) -> None:
    """Doc.

    Parameters
    ----------
    a : int
        Mentions b in its text, which does not count.
    """


class Holder:
    """No Parameters section although __init__ takes one."""

    def __init__(self, x):
        self.x = x

    @property
    def size(self) -> int:
        """A property needs its docstring only."""

    def undocumented(self):
        pass
''')
    found = [p.split(" ", 1)[1] for p in problems_of(sample)]
    assert found == [
        "no_returns: no Returns section",
        "lacks_b: Parameters section lacks b",
        "Holder: no Parameters section for x",
        "Holder.undocumented: no docstring",
    ]

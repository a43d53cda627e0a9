"""docs/architecture.md describes the code as it is.

* every package folder of the four layers is named in it (``pipeline/protocols/linear/``
  in backticks), so a new room fails here until the document says what it holds;
* every repository path it writes in backticks exists (``<name>`` matches anything);
* every dotted name under a layer it writes in backticks (``jobs.run.plan.make_plan``,
  ``pipeline.protocols.registry.Protocol.resolve``) is a module, or a name defined in one:
  read from the source, following ``from ... import`` re-exports, nothing imported;
* the layers import as its table says: only downwards, zarr only in ``storage_schema``,
  Prefect only in ``flows``, Dask in neither ``pipeline`` nor ``jobs`` (every import
  counted, those inside functions too);
* it keeps its parts: the layers, the rooms, the life of one cell and the three recipes.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from tests.helpers.code import PACKAGES, REPO, python_files
from tests.helpers.docs import DOCS, sections

ARCHITECTURE = DOCS / "architecture.md"
#: Top-level folders whose paths the document may name.
REPO_FOLDERS = (*PACKAGES, "tests", "docs", "benchmarks", "docker")
#: Third-party packages that only some layers may import, as the document's table says.
ONLY_IN = {"zarr": {"storage_schema"}, "numcodecs": {"storage_schema"}, "fsspec": {"storage_schema"},
           "prefect": {"flows"}, "prefect_dask": {"flows"}, "distributed": {"flows"},
           "dask": {"storage_schema", "flows"}}
PARTS = ("The layers", "The rooms", "The life of one cell", "Recipes")
RECIPES = ("Add a protocol", "Add a dataset adapter", "Add a command")


def _spans(text: str) -> list[str]:
    """The backticked spans of markdown text, outside fenced code blocks."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.findall(r"`([^`\n]+)`", prose)


@functools.cache
def _doc_spans() -> tuple[str, ...]:
    return tuple(_spans(ARCHITECTURE.read_text(encoding="utf-8")))


def _package_folders() -> list[str]:
    return sorted(str(p.parent.relative_to(REPO)) for pkg in PACKAGES for p in (REPO / pkg).rglob("__init__.py"))


# -- dotted names, resolved from the source --------------------------------------------------------
@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _module_file(dotted: str) -> Path | None:
    base = REPO.joinpath(*dotted.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _statements(body: list[ast.stmt]):
    """Statements of a module or class body, those under ``if``/``try`` included."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _statements(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _statements(node.body + node.orelse + node.finalbody
                                   + [s for h in node.handlers for s in h.body])


def _binding(body: list[ast.stmt], name: str, module: str):
    """What binds ``name`` in ``body``: a definition node, or the dotted name an import makes it."""
    for node in _statements(body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return node
        if isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:  # relative: from the module's package, up level - 1
                package = module.split(".") if _module_file(module).name == "__init__.py" else module.split(".")[:-1]
                source = ".".join([*package[: len(package) - node.level + 1], *([source] if source else [])])
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return f"{source}.{alias.name}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname == name:
                    return alias.name
    return None


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` names a module of the repository or a name defined in one."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        path = _module_file(module)
        if path is None:
            continue
        body, rest = _tree(path).body, parts[i:]
        for k, name in enumerate(rest):
            bound = _binding(body, name, module)
            if isinstance(bound, str):  # re-exported: follow it to where it is defined
                return resolves(".".join([bound, *rest[k + 1:]]))
            if bound is None:
                return False
            if k < len(rest) - 1:
                if not isinstance(bound, ast.ClassDef):
                    return False  # attributes of a function or a value are not followed
                body = bound.body
        return True
    return False


def _dotted(span: str) -> str | None:
    """The dotted name a span writes (``jobs.run.plan.make_plan`` of ``jobs.run.plan.make_plan(cfg)``)."""
    match = re.fullmatch(r"((?:%s)(?:\.\w+)+)(\(.*\))?" % "|".join(PACKAGES), span.strip())
    return match.group(1) if match else None


def _path_problem(span: str) -> str | None:
    """Why a repository path a span writes does not exist (None when it does, or it is no path)."""
    if not re.match(r"(%s)/" % "|".join(REPO_FOLDERS), span) or " " in span:
        return None
    pattern = re.sub(r"<[^>]+>", "*", span).rstrip("/")
    found = any(REPO.glob(pattern)) if "*" in pattern else (REPO / pattern).exists()
    return None if found else f"`{span}`: no such file or folder"


# -- the tests ---------------------------------------------------------------------------------
def test_every_package_folder_is_named():
    named = {s.rstrip("/") for s in _doc_spans()}
    missing = [f"{f}/" for f in _package_folders() if f not in named]
    assert not missing, (f"docs/architecture.md, 'The rooms': no row for the package folder(s) {missing}; "
                         "add '| `<folder>/` | what it holds |'")


def test_every_path_it_names_exists():
    problems = sorted({p for s in _doc_spans() if (p := _path_problem(s))})
    assert not problems, "docs/architecture.md names paths that are not there:\n  " + "\n  ".join(problems)


def test_every_dotted_name_it_names_exists():
    names = sorted({d for s in _doc_spans() if (d := _dotted(s))})
    assert names, "docs/architecture.md names no module or function: the check would hold nothing"
    missing = [n for n in names if not resolves(n)]
    assert not missing, ("docs/architecture.md names modules or names that do not exist (moved or renamed? "
                         "bring the page along):\n  " + "\n  ".join(missing))


def _imports(tree: ast.Module):
    """(line, top-level package) of every absolute import in a module, inside functions too."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name.split(".")[0]) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0]


def test_the_layers_import_as_the_page_says():
    problems = []
    for layer in PACKAGES:
        for path in python_files(layer):
            for line, top in _imports(_tree(path)):
                where = f"{path.relative_to(REPO)}:{line}"
                if top in PACKAGES and PACKAGES.index(top) > PACKAGES.index(layer):
                    problems.append(f"{where}: {layer} imports {top}, a layer above it")
                if top in ONLY_IN and layer not in ONLY_IN[top]:
                    problems.append(f"{where}: {layer} imports {top} (only {', '.join(sorted(ONLY_IN[top]))} may)")
    assert not problems, ("imports against the layers of docs/architecture.md (pipeline <- storage_schema <- jobs "
                          "<- flows):\n  " + "\n  ".join(problems))


def test_it_keeps_its_parts():
    parts = sections(ARCHITECTURE)
    recipes = sections(ARCHITECTURE, level=3)
    missing = [f"## {p}" for p in PARTS if p not in parts] + [f"### {r}" for r in RECIPES if r not in recipes]
    assert not missing, f"docs/architecture.md lacks {missing}"


# -- the checks themselves ------------------------------------------------------------------------------
def test_the_checks_find_what_does_not_exist():
    assert resolves("jobs.run.plan.make_plan") and resolves("jobs.config.load_config")  # defined, re-exported
    assert resolves("pipeline.protocols.registry.Protocol.resolve") and resolves("storage_schema.store")
    assert resolves("pipeline.protocols.cell.EvalData.train_blocks")  # a dataclass field
    assert not resolves("jobs.run.plan.make_plans") and not resolves("jobs.nowhere")
    assert not resolves("jobs.run.plan.make_plan.attribute")
    assert _dotted("jobs.run.plan.make_plan(cfg)") == "jobs.run.plan.make_plan" and _dotted("repeval run") is None
    assert _dotted("dask.array") is None and _dotted("pipeline/") is None
    assert _path_problem("pipeline/protocols/<family>/protocols.py") is None
    assert _path_problem("/".join(("jobs", "nowhere.py"))) and _path_problem("repeval run config.yaml") is None
    assert _spans("a `x` b\n```\n`y`\n```\n`z`") == ["x", "z"]
    assert "pipeline/protocols/linear" in _package_folders() and "flows/cli" in _package_folders()

"""Small modules: none of the packages' modules exceeds about 450 lines unless its docstring
says why ("longer than 450 lines because ...")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers.code import PACKAGES, module_name, python_files

MAX_LINES = 450


@pytest.mark.parametrize("path", [p for folder in PACKAGES for p in python_files(folder)], ids=module_name)
def test_module_is_small_or_says_why(path: Path) -> None:
    text = path.read_text()
    lines = text.count("\n")
    if lines <= MAX_LINES:
        return
    doc = ast.get_docstring(ast.parse(text)) or ""
    assert "longer than 450 lines because" in " ".join(doc.split()).lower(), (
        f"{module_name(path)} has {lines} lines; split it, or write at its top why it is "
        "longer than 450 lines because ..."
    )

"""docs/datasets.md has a section per adapter added here, one table row per parameter."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from pipeline.datasets import adapter_class
from tests.pipeline.datasets.layouts_more import LAYOUTS

DOC = Path(__file__).resolve().parents[3] / "docs" / "datasets.md"


def _sections() -> dict[str, str]:
    parts = re.split(r"^## ", DOC.read_text(encoding="utf-8"), flags=re.M)[1:]
    return {p.split("\n", 1)[0].strip(): p for p in parts}


@pytest.mark.parametrize("adapter", sorted(LAYOUTS))
def test_every_parameter_has_its_row(adapter: str) -> None:
    section = _sections()[adapter]
    rows = re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.M)
    params = [p for p in inspect.signature(adapter_class(adapter).__init__).parameters if p != "self"]
    assert rows == params

"""The module-scoped tally of bad inputs tried, shared by every property test module."""

from __future__ import annotations

import pytest

from tests.helpers.tally import Tally


@pytest.fixture(scope="module")
def tally():
    """One Tally per test module; prints each family's figures when the module ends."""
    t = Tally()
    yield t
    for family in sorted(t.counts):
        print(t.report(family))

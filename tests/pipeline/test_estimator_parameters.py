"""Estimator parameters are checked as numbers whatever their Python type: an int beyond
int64 (which numpy's isfinite cannot take) is a finite number, a NaN or a bool is refused."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.errors import ConfigError
from pipeline.protocols.inputs.parameters import check_number


@pytest.mark.parametrize("value", [669177974294775547545255936, 3, np.int64(3), 0.5, np.float32(0.5)])
def test_any_finite_number_in_range_is_taken(value):
    assert check_number(value, "tol", 0) == value


@pytest.mark.parametrize("value", [float("nan"), float("inf"), True, "1", -1, 10**30])
def test_anything_else_is_refused_naming_the_parameter(value):
    with pytest.raises(ConfigError, match=r"The 'tol' parameter must be a finite number >= 0 and <= 1; got "):
        check_number(value, "tol", 0, 1)

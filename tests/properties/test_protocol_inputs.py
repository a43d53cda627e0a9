"""Bad feature arrays handed to every protocol: NaN/Inf, wrong shapes, empty splits, one
class, label/row count mismatches, non-integer labels. Each is refused with a repeval error;
never a traceback from numpy, sklearn or torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.protocols.registry import EvalData, get_protocol, resolve_settings
from tests.helpers.protocols import as_tokens, cheap_settings, feature_protocols


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():  # tiny arrays: a torch thread pool only adds wake-up latency on a busy machine
    threads = torch.get_num_threads(), torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads[0])


PROTOCOLS = feature_protocols("pooled", "tokens")  # every entry that reads feature arrays (maps: test_dense_protocols)
KINDS = ["nan/inf train", "nan/inf test", "1-D train", "3-D test", "width mismatch", "empty train", "empty test",
         "one class", "train label count", "test label count", "fractional labels", "string labels",
         "negative labels"]


@st.composite
def bad_data(draw):
    rng = np.random.default_rng(draw(st.integers(0, 50)))
    y_train, y_test = np.repeat(np.arange(4), 6), np.repeat(np.arange(4), 3)
    X_train, X_test = rng.normal(size=(24, 5)), rng.normal(size=(12, 5))
    kind = draw(st.sampled_from(KINDS))
    names = ["X_train", "X_test", "X", "y", "y_train", "y_test"]  # the message names the array at fault
    if kind.startswith("nan/inf"):
        X = X_train if kind.endswith("train") else X_test
        X[draw(st.integers(0, len(X) - 1)), draw(st.integers(0, 4))] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    elif kind == "1-D train":
        X_train = X_train[:, 0]
    elif kind == "3-D test":
        X_test = X_test[:, :, None]
    elif kind == "width mismatch":
        X_test = X_test[:, : draw(st.integers(1, 4))]
    elif kind == "empty train":
        X_train, y_train = X_train[:0], y_train[:0]
    elif kind == "empty test":
        X_test, y_test = X_test[:0], y_test[:0]
    elif kind == "one class":
        y_train = np.zeros_like(y_train)
    elif kind == "train label count":
        y_train = y_train[: draw(st.integers(1, 23))]
    elif kind == "test label count":
        y_test = np.concatenate([y_test, y_test[:draw(st.integers(1, 3))]])
    elif kind == "fractional labels":
        y_train = y_train + 0.5
    elif kind == "string labels":
        y_train = y_train.astype(str)
    elif kind == "negative labels":
        y_train = y_train - 2
    data = EvalData(y_train=y_train, X_test=X_test, y_test=y_test, n_classes=4, X_train=X_train)
    return kind, data, names


@pytest.mark.parametrize("name", PROTOCOLS)
@settings(max_examples=20, deadline=None)
@given(case=bad_data())
def test_bad_arrays_are_refused_by_every_protocol(tally, name, case):
    kind, data, names = case
    protocol = get_protocol(name)
    if protocol.tokens:  # the same faults in token features: every row as two tokens
        data = as_tokens(data)
    full = resolve_settings(name, cheap_settings(name))
    tally.expect_error(f"feature arrays: protocol fits ({name})", lambda: protocol(data, full), names,
                       kind=kind)

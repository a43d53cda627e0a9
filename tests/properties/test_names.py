"""Names that become store key components: every bad one is refused, naming field and value,
before anything is written; every accepted one stays a single component inside the store."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.names import MAX_NAME_LENGTH, validate_name
from storage_schema import FeatureStore, feature_key, labels_key
from tests.helpers.names import SAFE, bad_names

not_strings = st.one_of(st.none(), st.integers(), st.floats(allow_nan=False), st.binary(max_size=5),
                        st.lists(SAFE, max_size=2), st.booleans())


def _value_named(value: object) -> list[str]:
    """What a message must quote of ``value``: its (start's) repr, or nothing for ''."""
    if isinstance(value, str):
        return [repr(value[:40])[:-1]] if value else []
    return [repr(value)[:30]]


@settings(max_examples=150, deadline=None)
@given(name=bad_names | not_strings, field=st.sampled_from(["model name", "dataset name", "split name",
                                                             "layer name"]))
def test_bad_names_are_refused_naming_field_and_value(tally, name, field):
    error = tally.expect_error("names: validate_name", lambda: validate_name(name, field), [field], kind=field)
    for quoted in _value_named(name):
        assert quoted in str(error), f"value not quoted in: {error}"


@settings(max_examples=150, deadline=None)
@given(name=st.text(max_size=MAX_NAME_LENGTH + 5) | SAFE | bad_names)
def test_accepted_names_stay_one_component_inside_the_store(name):
    """Any text at all: either refused, or a single path component that cannot leave the root."""
    root = "/srv/store"
    try:
        validate_name(name)
    except Exception as exc:  # noqa: BLE001
        assert type(exc).__name__ == "InvalidNameError"
        return
    path = os.path.normpath(os.path.join(root, "features", name, "d", "s", "pre_logits"))
    assert path.startswith(root + "/features/") and path.split("/")[4] == name
    assert name not in (".", "..") and os.sep not in name and not name.startswith(".")


@pytest.fixture(scope="module")
def store_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("names") / "store"
    FeatureStore(str(root)).write_labels("ok", "train", np.array([0, 1]), {"fingerprint": "L"})
    return root


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=bad_names, where=st.sampled_from(["model", "dataset", "split", "layer"]))
def test_store_apis_refuse_bad_names_and_write_nothing(tally, store_root, name, where):
    """Through the store itself: reads and writes with a bad name raise before any I/O."""
    store = FeatureStore(str(store_root))
    parts = {"model": "m", "dataset": "ok", "split": "train", "layer": "pre_logits", where: name}
    field = f"{where} name"
    tally.expect_error("names: store APIs", lambda: store.features(**parts), [field], store_root, kind="read")
    tally.expect_error("names: store APIs", lambda: feature_key(**parts), [field], store_root, kind="key")
    if where in ("dataset", "split"):
        tally.expect_error(
            "names: store APIs",
            lambda: store.write_labels(parts["dataset"], parts["split"], np.array([0, 1]), {"fingerprint": "x"}),
            [field], store_root, kind="write_labels")
        tally.expect_error("names: store APIs", lambda: labels_key(parts["dataset"], parts["split"]), [field],
                           store_root, kind="labels key")

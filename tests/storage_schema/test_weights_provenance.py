"""Which weights an array came from, and when a cell's arrays disagree: the provenance helpers."""

from __future__ import annotations

from storage_schema.provenance import (
    UNKNOWN_WEIGHTS, WEIGHTS_FIELD, array_weights, record_weights, short_weights, weights_disagreement,
)

OLD, NEW = "adb180" + "1" * 26, "ebf433" + "2" * 26


def test_an_array_says_its_own_weights_else_its_encoders_else_unknown() -> None:
    assert array_weights({WEIGHTS_FIELD: OLD, "encoder": {WEIGHTS_FIELD: NEW}}) == OLD
    assert array_weights({"encoder": {WEIGHTS_FIELD: NEW}}) == NEW  # written before the attribute existed
    assert array_weights({"kind": "features"}) is None  # imported features
    assert short_weights(OLD) == "adb180111111" and short_weights(None) == UNKNOWN_WEIGHTS
    assert record_weights({"provenance": {WEIGHTS_FIELD: OLD}}) == OLD and record_weights({}) is None


def test_a_disagreement_names_both_arrays_and_both_fingerprints_in_one_line() -> None:
    why = weights_disagreement({"train features A": OLD, "test features B": NEW})
    assert why == "train features A come from weights adb180111111, test features B from weights ebf433222222"
    assert weights_disagreement({"train features A": OLD, "test features B": OLD}) is None
    assert weights_disagreement({"train features A": OLD, "test features B": None}) is None  # unknown: no claim
    assert "the record says weights ebf433222222" in weights_disagreement({"train features A": OLD}, NEW)
    assert weights_disagreement({"train features A": None}, NEW) is None

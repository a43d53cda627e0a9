"""``to_plain``, the one conversion to plain values: what the hand-written conversions it
replaced (``to_dict`` methods, a ledger record's ``json_ready``, the settings'
``plain_settings``, the correlation report's ``_json_ready``) wrote, it writes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from pipeline.plain import to_plain


@dataclass(frozen=True)
class _Inner:
    pair: tuple[int, int] = (1, 2)
    by_key: dict = field(default_factory=lambda: {1: "one", "two": (2,)})


@dataclass(frozen=True)
class _Outer:
    inner: _Inner = field(default_factory=_Inner)
    rows: list = field(default_factory=lambda: [_Inner(pair=(3, 4)), {"score": np.float64(0.5)}])
    values: np.ndarray = field(default_factory=lambda: np.arange(3, dtype=np.int64))


def test_dataclasses_tuples_and_numpy_values_become_dicts_lists_and_python_numbers():
    plain = to_plain(_Outer())
    assert plain == {"inner": {"pair": [1, 2], "by_key": {"1": "one", "two": [2]}},
                     "rows": [{"pair": [3, 4], "by_key": {"1": "one", "two": [2]}}, {"score": 0.5}],
                     "values": [0, 1, 2]}
    assert type(plain["rows"][1]["score"]) is float and {type(v) for v in plain["values"]} == {int}
    assert json.loads(json.dumps(plain)) == plain  # survives a JSON round trip unchanged


def test_mapping_keys_become_strings_as_a_ledger_record_writes_them():
    # str(key), as the records' json_ready did: True -> "True" (JSON itself would write "true")
    assert to_plain({2: np.int64(3), True: [np.float32(0.25)], None: (1, "s")}) == {
        "2": 3, "True": [0.25], "None": [1, "s"]}
    assert to_plain(MappingProxyType({"a": (1,)})) == {"a": [1]}  # any mapping, not only dicts
    assert to_plain(np.zeros((2, 2))) == [[0.0, 0.0], [0.0, 0.0]]


def test_plain_values_and_classes_are_left_as_they_are():
    for value in ("text", 3, 0.5, None, True):
        assert to_plain(value) is value
    assert to_plain(_Inner) is _Inner  # a dataclass type is not an instance

"""The recipe "Add a protocol" of docs/architecture.md, held to the code.

A throwaway nearest-class-mean probe is written as the recipe says (one module, one
``@register_protocol`` entry with its cheap settings and a memory model composed of
``pipeline.protocols.memory``'s parts) in a temporary module on ``sys.path``. The tests that
run over every registered entry must then pass for it without being told of it (cheap run,
bad inputs, memory estimate, settings fuzzing), the docs check must ask for its section,
and an entry that lacks what those tests need must be named, with what to add where.
Each throwaway entry is unregistered afterwards, so no other test sees it.
"""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

import tests.code.test_docs as docs_tests
import tests.properties.test_protocol_inputs as inputs_tests
import tests.properties.test_protocol_registry as registry_tests
import tests.properties.test_protocol_settings as settings_tests
from pipeline.protocols.registry import get_protocol, list_protocols, unregister_protocol
from tests.helpers.protocols import missing_requirements

NCM = textwrap.dedent('''
    """A nearest-class-mean probe: each test row takes the class of the nearest train mean."""

    from collections.abc import Mapping
    from typing import Any

    import numpy as np

    from pipeline.protocols.cell import CellShape
    from pipeline.protocols.evidence import class_evidence
    from pipeline.protocols.memory import RUNTIME, features, indices, labels, matrix, peak
    from pipeline.protocols.metrics import CLASS_METRICS, accuracy_metrics
    from pipeline.protocols.registry import EvalData, ProtocolResult, register_protocol

    _ROWS = 4096  # rows per block: bounds every temporary (never a full-size copy of the features)


    def ncm_memory(c: CellShape, s: Mapping[str, Any]) -> int:
        return peak(features=features(c, streams=False), labels=labels(c),
                    classes=indices(c.n_train, arrays=2),  # np.unique's sorted labels and their inverse
                    means=matrix(c.n_classes, c.dim, copies=2), block=matrix(_ROWS, c.dim, copies=2),
                    scores=matrix(_ROWS, c.n_classes, copies=3), predictions=indices(c.n_test), runtime=RUNTIME)


    def _rows(X, metric: str) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        return X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-12) if metric == "cosine" else X


    @register_protocol(
        "recipe_ncm", version=1, defaults={"metric": "euclidean"}, choices={"metric": ("euclidean", "cosine")},
        memory=ncm_memory, metrics=CLASS_METRICS, cheap_settings={},
        description="nearest class mean (a throwaway of tests/properties/test_protocol_recipe.py)",
    )
    def _ncm(data: EvalData, s: Mapping[str, Any]) -> ProtocolResult:
        X = data.train()
        classes, index = np.unique(np.asarray(data.y_train), return_inverse=True)
        sums = np.zeros((len(classes), X.shape[1]))
        for i in range(0, len(X), _ROWS):
            np.add.at(sums, index[i:i + _ROWS], _rows(X[i:i + _ROWS], s["metric"]))
        means = sums / np.bincount(index)[:, None]
        squares = (means ** 2).sum(axis=1)
        pred = np.concatenate([classes[np.argmin(squares - 2 * _rows(data.X_test[i:i + _ROWS], s["metric"]) @ means.T,
                                                 axis=1)] for i in range(0, len(data.X_test), _ROWS)])
        return ProtocolResult(accuracy_metrics(data.y_test, pred, data.mean_per_class), {},
                              evidence=class_evidence(data, pred))
''')
# the same entry without cheap settings and without a memory model: what a hurried recipe leaves out
INCOMPLETE = textwrap.dedent('''
    from pipeline.protocols.registry import ProtocolResult, register_protocol


    @register_protocol("recipe_incomplete", version=1, defaults={}, description="an entry missing its parts")
    def _incomplete(data, s):
        return ProtocolResult({"score": 0.0}, {})
''')


def _register(tmp_path, monkeypatch, module: str, source: str, name: str):
    (tmp_path / f"{module}.py").write_text(source, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module(module)
    assert name in list_protocols()
    return name


@pytest.fixture
def ncm(tmp_path, monkeypatch):
    yield _register(tmp_path, monkeypatch, "recipe_ncm_probe", NCM, "recipe_ncm")
    unregister_protocol("recipe_ncm")
    sys.modules.pop("recipe_ncm_probe", None)


@pytest.fixture
def incomplete(tmp_path, monkeypatch):
    yield _register(tmp_path, monkeypatch, "recipe_incomplete_probe", INCOMPLETE, "recipe_incomplete")
    unregister_protocol("recipe_incomplete")
    sys.modules.pop("recipe_incomplete_probe", None)


def test_a_protocol_added_by_the_recipe_passes_every_per_protocol_test(ncm, tally):
    assert missing_requirements(ncm) == []
    registry_tests.test_every_entry_has_what_the_per_protocol_tests_need(ncm)
    settings_tests.test_cheap_settings_run(ncm)
    inputs_tests.test_bad_arrays_are_refused_by_every_protocol(tally, name=ncm)
    registry_tests.test_memory_estimate_grows_with_the_data_and_stays_near_it(ncm)
    settings_tests.test_settings_are_refused_or_run_or_fail_clearly(tally, name=ncm)
    registry_tests.test_multilabel_targets_are_refused_by_single_label_protocols(ncm)
    # its docs section is the one thing a test module cannot write: the docs check asks for it by name
    with pytest.raises(AssertionError, match=r"docs/protocols.md lacks a section for registered protocol\(s\) "
                                             r"\['recipe_ncm'\]"):
        docs_tests.test_every_registered_protocol_has_a_section()


def test_the_per_protocol_tests_list_the_new_entry_by_themselves(ncm):
    from tests.helpers.protocols import CHEAP, feature_protocols

    assert ncm in feature_protocols("pooled") and CHEAP[ncm] == {}
    assert get_protocol(ncm).memory_bytes(1000, 100, 0, 16, 4, 4) > 1000 * 16 * 4


def test_an_incomplete_entry_is_named_with_what_to_add(incomplete):
    problems = missing_requirements(incomplete)
    assert problems == [
        "protocol 'recipe_incomplete' has no cheap_settings: add cheap_settings={...} (settings for a run on a few "
        "dozen rows; {} if its defaults are cheap) to its @register_protocol entry in recipe_incomplete_probe",
        "protocol 'recipe_incomplete' has no memory estimate: add memory=<fn(CellShape, settings) -> bytes>, "
        "composed of pipeline.protocols.memory's parts, to its @register_protocol entry in recipe_incomplete_probe",
    ]
    with pytest.raises(AssertionError, match="protocol 'recipe_incomplete' has no cheap_settings"):
        registry_tests.test_every_entry_has_what_the_per_protocol_tests_need(incomplete)
    with pytest.raises(AssertionError, match="protocol 'recipe_incomplete' has no cheap_settings"):
        settings_tests.test_cheap_settings_run(incomplete)


def test_the_throwaway_entries_are_gone_after_their_tests():
    assert not {"recipe_ncm", "recipe_incomplete"} & set(list_protocols())

"""The recipe "Add a protocol" of docs/architecture.md, held to the code.

A throwaway nearest-class-mean probe is written as the recipe says (one module, one
``@register_protocol`` entry with its cheap settings, a memory model composed of
``pipeline.protocols.memory``'s parts, a ``transform`` setting applied by
``apply_transform``, streamed train rows read as ``FeatureRows`` blocks on the registry's
``device``) in a temporary module on ``sys.path``. The tests that
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

    from pipeline.protocols.blocks import FeatureRows, block_rows, predict_from_scores
    from pipeline.protocols.cell import CellShape
    from pipeline.protocols.evidence import class_evidence
    from pipeline.protocols.inputs.devices import resolve_device
    from pipeline.protocols.memory import (
        RUNTIME, features, indices, labels, matrix, peak, row_blocks, transform_state,
    )
    from pipeline.protocols.metrics import CLASS_METRICS, accuracy_metrics
    from pipeline.protocols.registry import EvalData, ProtocolResult, register_protocol
    from pipeline.protocols.transforms import TRANSFORM_NAMES, apply_transform


    def ncm_memory(c: CellShape, s: Mapping[str, Any]) -> int:
        rows = block_rows(max(c.dim, c.n_classes))
        return peak(features=features(c, streams=True), labels=labels(c), means=matrix(c.n_classes, c.dim, copies=3),
                    blocks=row_blocks(4), scores=matrix(min(rows, c.n_test), c.n_classes, copies=2),
                    predictions=indices(c.n_test), transform=transform_state(c, s.get("transform")), runtime=RUNTIME)


    @register_protocol(
        "recipe_ncm", version=1, defaults={"metric": "euclidean", "transform": "none"},
        choices={"metric": ("euclidean", "cosine"), "transform": TRANSFORM_NAMES},
        runs_on_device=True, streams_train=True, memory=ncm_memory, metrics=CLASS_METRICS, cheap_settings={},
        description="nearest class mean (a throwaway of tests/properties/test_protocol_recipe.py)",
    )
    def _ncm(data: EvalData, s: Mapping[str, Any]) -> ProtocolResult:
        import torch

        device = resolve_device(s["device"])
        train = data.train_rows()
        train, test = apply_transform(s["transform"], train, train, FeatureRows.of(data.X_test), device=device)
        unit = (lambda H: H / H.norm(dim=1, keepdim=True)) if s["metric"] == "cosine" else (lambda H: H)
        sums = torch.zeros((data.n_classes, train.n_features), dtype=torch.float64, device=device)
        for H, start in train.blocks(device, torch.float64):
            sums.index_add_(0, torch.as_tensor(data.y_train[start:start + len(H)], device=device), unit(H))
        counts = torch.as_tensor(np.bincount(data.y_train, minlength=data.n_classes), device=device)
        means = unit(sums / counts.clamp(min=1)[:, None])
        offset = (means ** 2).sum(dim=1) if s["metric"] == "euclidean" else torch.zeros(len(means), device=device)
        offset = torch.where(counts > 0, offset, torch.inf)  # a class without train rows is never predicted
        scores = ((2 * unit(Q) @ means.T - offset, start) for Q, start in test.blocks(device, torch.float64))
        pred = predict_from_scores(scores, len(test), np.arange(data.n_classes))
        return ProtocolResult(accuracy_metrics(data.y_test, pred, data.mean_per_class), {"device": str(device)},
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
    registry_tests.test_memory_estimate_counts_the_features_and_labels_it_holds(ncm)
    registry_tests.test_streamed_train_features_give_the_in_memory_result(ncm)
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

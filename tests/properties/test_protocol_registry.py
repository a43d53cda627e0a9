"""The protocol registry: eager and cheap registration, capability flags, memory estimates,
the device setting, streamed train features and multi-label targets through every entry."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from pipeline.errors import ConfigError, DataValidationError
from pipeline.protocols.registry import EvalData, get_protocol, list_protocols, resolve_settings
from tests.helpers.protocols import CHEAP, as_tokens, feature_protocols, missing_requirements

# The built-in entries' flags, pinned (a new entry is covered by the registry-driven tests below, unnamed here)
STREAMING = {"knn", "ridge", "fewshot", "lowshot", "invariance"}
MULTILABEL = {"ridge", "logistic"}
TOKENS = {"attentive"}
DENSE = {"segmentation": "segmentation", "normals": "normals"}
WEIGHTS = {"finetune", "saliency", "colour_detail"}  # an encoder's weights and images: test_encoder_jobs
PROBES = ("logistic", "ridge", "knn", "fewshot", "lowshot", "mlp", "attentive")
BUILT_IN = STREAMING | MULTILABEL | TOKENS | set(DENSE) | WEIGHTS | set(PROBES)


def test_registry_import_registers_everything_without_heavy_libraries():
    code = ("import sys; from pipeline.protocols.registry import list_protocols, get_protocol; "
            "print(list_protocols()); get_protocol('knn').memory_bytes(10, 5, 0, 4, 2, 4); "
            "print(sorted(m for m in ('torch', 'sklearn', 'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    names, heavy = out.strip().splitlines()
    assert names == str(list_protocols()) and BUILT_IN <= set(list_protocols())
    assert heavy == "[]"


@pytest.mark.parametrize("name", list_protocols())
def test_every_entry_has_what_the_per_protocol_tests_need(name):
    """Cheap settings, a memory estimate, a bad-input family (a docs section: tests/code/test_docs.py)."""
    problems = missing_requirements(name)
    assert not problems, "\n".join(problems)


def test_capability_flags():
    assert {n for n in BUILT_IN if get_protocol(n).streams_train} == STREAMING
    assert {n for n in BUILT_IN if get_protocol(n).multilabel} == MULTILABEL | {"saliency", "colour_detail"}
    assert {n for n in BUILT_IN if get_protocol(n).tokens} == TOKENS
    assert {n: get_protocol(n).dense for n in BUILT_IN if get_protocol(n).dense} == DENSE
    assert {get_protocol(n).reads for n in BUILT_IN} == {"pooled", "tokens", "map", "weights"}
    assert {n for n in BUILT_IN if not get_protocol(n).reads_features} == WEIGHTS
    assert {n for n in BUILT_IN if get_protocol(n).runs_on_device} == {*PROBES, *DENSE}
    on_device = [n for n in list_protocols() if get_protocol(n).runs_on_device]
    for name in on_device:  # the registry adds the setting: last, default auto
        assert list(get_protocol(name).defaults)[-1] == "device" and get_protocol(name).defaults["device"] == "auto"
    assert all("device" not in get_protocol(n).defaults for n in set(list_protocols()) - set(on_device))


def test_an_entry_that_declares_its_own_device_setting_is_refused():
    from pipeline.protocols.registry import register_protocol

    with pytest.raises(ConfigError, match=r"protocol 'own_device' declares its own 'device' setting; "
                                          r"runs_on_device=True adds it"):
        register_protocol("own_device", 1, {"device": "cpu"}, "x", runs_on_device=True)(lambda data, s: None)
    assert "own_device" not in list_protocols()


def test_transform_names_match_the_transforms():
    from pipeline.protocols.transforms import TRANSFORM_NAMES
    from pipeline.protocols.transforms.transformers import TRANSFORMS

    assert TRANSFORM_NAMES == tuple(TRANSFORMS)


# dense ones: tests/pipeline/test_dense_memory.py
@pytest.mark.parametrize("name", feature_protocols("pooled", "tokens"))
def test_memory_estimate_grows_with_the_data_and_stays_near_it(name):
    proto = get_protocol(name)
    T = 197 if proto.tokens else 1  # a ViT-B/16's tokens (float16) for the attentive probe
    small = proto.memory_bytes(10_000, 1_000, 0, 256, 100, 4, n_tokens=T)
    large = proto.memory_bytes(1_000_000, 50_000, 0, 768, 1000, 2, n_tokens=T)
    assert 0 < small < large
    features = (1_000_000 + 50_000) * T * 768 * 2
    # the lab-scale cell: at most 1.5x its features plus terms that do not grow with n
    assert large <= 1.5 * features + 512 * 2**20, (name, large / features)
    more_rows = proto.memory_bytes(2_000_000, 50_000, 0, 768, 1000, 2, n_tokens=T)
    held = 0 if proto.streams_train else 1_000_000 * T * 768 * 2
    assert more_rows - large <= held + 1_000_000 * 64  # no per-row term beyond the features, labels


@pytest.mark.parametrize("name", feature_protocols("pooled", "tokens"))
def test_memory_estimate_counts_the_features_and_labels_it_holds(name):
    """The measured-peak test cannot see a model that leaves the features out at its sizes (the
    fixed terms hide them), so the lab-scale cell's estimate must hold at least these two parts."""
    from pipeline.protocols.cell import CellShape
    from pipeline.protocols.memory import features, labels

    proto = get_protocol(name)
    T = 197 if proto.tokens else 1
    c = CellShape(1_000_000, 50_000, 10_000, 768, 1000, 2, T, 0)
    held = features(c, streams=proto.streams_train) + labels(c)
    estimate = proto.memory_bytes(c.n_train, c.n_test, c.n_val, c.dim, c.n_classes, c.itemsize, n_tokens=T)
    assert estimate >= held, (
        f"protocol {name!r}'s memory model ({proto.memory.__module__}.{proto.memory.__name__}) gives "
        f"{estimate / 2**20:.0f} MiB for a cell whose features and labels alone hold {held / 2**20:.0f} MiB: "
        f"compose it with peak(features=features(c, streams={proto.streams_train}), labels=labels(c), ...) "
        "(pipeline.protocols.memory)")


@pytest.mark.parametrize("value", ["gpu", "cuda:x", "", "CPU", 3])
def test_device_setting_is_checked_at_config_load(value):
    for name in [n for n in list_protocols() if get_protocol(n).runs_on_device]:
        with pytest.raises(ConfigError, match=r"device.*(is not a device; valid: auto, cpu, cuda, cuda:<i>|wrong type)"):
            resolve_settings(name, {"device": value})
    assert resolve_settings("ridge", {"device": "cuda:1"})["device"] == "cuda:1"  # syntax only at load


def _data(multilabel: bool = False) -> EvalData:
    rng = np.random.default_rng(0)
    y_train, y_test = np.repeat(np.arange(4), 12), np.repeat(np.arange(4), 5)
    centers = rng.normal(size=(4, 6)) * 3
    X_train = centers[y_train] + rng.normal(size=(48, 6))
    X_test = centers[y_test] + rng.normal(size=(20, 6))
    if multilabel:
        y_train = (np.eye(4)[y_train] + (rng.random((48, 4)) < 0.2)).clip(0, 1).astype(np.uint8)
        y_test = (np.eye(4)[y_test] + (rng.random((20, 4)) < 0.2)).clip(0, 1).astype(np.uint8)
    return EvalData(y_train=y_train, X_test=X_test, y_test=y_test, n_classes=4, X_train=X_train)


@pytest.mark.parametrize("name", [n for n in list_protocols() if get_protocol(n).streams_train])
def test_streamed_train_features_give_the_in_memory_result(name):
    data = _data()
    X = data.X_train
    blocks = lambda: ((X[i:i + 7], i) for i in range(0, len(X), 7))  # noqa: E731
    streamed = EvalData(y_train=data.y_train, X_test=data.X_test, y_test=data.y_test, n_classes=4,
                        train_blocks=blocks)
    settings = resolve_settings(name, CHEAP.get(name, {}))
    try:
        a = get_protocol(name)(streamed, settings)
    except Exception as exc:  # noqa: BLE001 - re-raised with what to change
        raise AssertionError(
            f"protocol {name!r} declares streams_train=True but fails on streamed train features "
            f"(EvalData.X_train is None, train_blocks given): {type(exc).__name__}: {exc}. Read the train "
            "features with data.train_rows() (FeatureRows, in memory or streamed), not data.X_train") from exc
    b = get_protocol(name)(data, settings)
    flat = {k: v for k, v in b.metrics.items() if isinstance(v, float)}
    assert {k: a.metrics[k] for k in flat} == pytest.approx(flat, rel=1e-9)
    assert {k: v for k, v in a.metrics.items() if k not in flat} == {k: v for k, v in b.metrics.items() if k not in flat}
    if get_protocol(name).runs_on_device:
        assert a.diagnostics["device"] == "cpu"


@pytest.mark.parametrize("name", [n for n in feature_protocols("pooled") if get_protocol(n).multilabel])
def test_multilabel_targets_are_scored_by_mean_average_precision(name):
    result = get_protocol(name)(_data(multilabel=True), resolve_settings(name, CHEAP.get(name, {})))
    assert set(result.metrics) >= {"map11", "score"} and 0.5 < result.metrics["score"] <= 1.0
    assert "ece" not in result.metrics  # softmax calibration has no multi-label counterpart


@pytest.mark.parametrize("name", feature_protocols("tokens"))
def test_token_protocols_take_only_token_features_and_the_others_only_pooled_ones(name):
    data = _data()
    settings = resolve_settings(name, CHEAP.get(name, {}))
    with pytest.raises(DataValidationError, match=rf"X_train has shape \(48, 6\), but protocol '{name}' reads token "
                                                   r"features \(n, T, d\)"):
        get_protocol(name)(data, settings)
    trained = resolve_settings(name, {**CHEAP.get(name, {}), "max_epochs": 40, "patience": 10})
    assert get_protocol(name)(as_tokens(data), trained).metrics["score"] > 0.5
    for other in feature_protocols("pooled"):  # dense ones: test_dense_protocols
        with pytest.raises(DataValidationError, match=rf"X_train has shape \(48, 2, 6\): token features, which "
                                                       rf"protocol '{other}' cannot take"):
            get_protocol(other)(as_tokens(data), resolve_settings(other, CHEAP.get(other, {})))


@pytest.mark.parametrize("name", [n for n in feature_protocols("pooled", "tokens") if not get_protocol(n).multilabel])
def test_multilabel_targets_are_refused_by_single_label_protocols(name):
    able = ", ".join(n for n in feature_protocols() if get_protocol(n).multilabel)
    with pytest.raises(DataValidationError, match=rf"multi-label targets, which protocol '{name}' cannot take; "
                                                   rf"protocols that can: {able}"):
        get_protocol(name)(_data(multilabel=True), resolve_settings(name, CHEAP.get(name, {})))


def test_calibration_uses_the_probes_own_split():
    from pipeline.protocols.audits.calibration import calibration_report
    from pipeline.protocols.linear.logistic import LogisticProbe
    from pipeline.protocols.transforms.transformers import L2Normalize

    data = _data()
    settings = resolve_settings("logistic", {"Cs": [0.1, 1.0, 10.0], "seed": 4})
    result = get_protocol("logistic")(data, settings)
    X = L2Normalize().fit(data.X_train).transform(data.X_train)
    probe = LogisticProbe(Cs=[0.1, 1.0, 10.0], random_state=4).fit(X, data.y_train)
    tr, va = probe.train_index_, probe.val_index_
    held = LogisticProbe(C=probe.C_).fit(X[tr], data.y_train[tr])
    X_te = L2Normalize().fit(data.X_train).transform(data.X_test)
    cal = calibration_report(held.decision_function(X[va]), data.y_train[va], probe.decision_function(X_te),
                             data.y_test)
    assert result.diagnostics["temperature"] == pytest.approx(cal.temperature, rel=1e-6)
    assert result.metrics["ece"] == pytest.approx(cal.ece_before, abs=1e-6)  # solver tolerance


def test_a_setting_added_at_its_old_behaviour_keeps_the_records_identity():
    from jobs.config.protocols import settings_hash

    entry = get_protocol("logistic")
    assert entry.added_settings == {"refine_grid": False}
    before = settings_hash("logistic", {})
    assert not set(entry.added_settings) & set(entry.result_settings(entry.resolve({})))
    assert settings_hash("logistic", {"refine_grid": False}) == before
    assert settings_hash("logistic", {"refine_grid": True}) != before
    # settings that are not added ones count at every value, their default included
    assert settings_hash("logistic", {"refine_rtol": 1e-3}) != before
    assert settings_hash("logistic", {"selection": "seed"}) != before
    assert entry.result_settings(entry.resolve({}))["selection"] == "stable"

"""Protocol settings: any value of any known setting is either refused by resolve_settings
with a ConfigError naming the setting, or the protocol runs on valid data, or it raises a
repeval error; never a library traceback.

Found and fixed with this property: numeric settings had no ranges (n_neighbors=0, C=0,
seed=-1, val_fraction=0 failed deep in numpy/sklearn or not at all), None was accepted for
every setting, floats for integer settings, NaN/inf anywhere, and any string for the
ridge/logistic grids. registry.Bound and the protocols' ``bounds`` now refuse them. Later:
a weight decay of 3.4e38 (a finite double past float32's range) reached torch's SGD step in
the middle of a segmentation fit; an optimizer's step sizes and decays are now at most
``OPTIMIZER_MAX``."""

from __future__ import annotations

import re

import numpy as np
import torch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.protocols.registry import EvalData, get_protocol, resolve_settings
from tests.helpers.protocols import as_tokens, cheap_settings, dense_data, feature_protocols


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():  # tiny arrays: a torch thread pool only adds wake-up latency on a busy machine
    threads = torch.get_num_threads(), torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads[0])

ANY_VALUE = st.one_of(
    st.integers(-3, 40), st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
    st.none(), st.text(max_size=6), st.sampled_from(["default", "all", "l2", "none", "ridge", "cosine", "exp"]),
    st.lists(st.integers(-2, 8) | st.sampled_from(["all", "x"]), max_size=3), st.lists(st.floats(-1, 10), max_size=3),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
)


def _data() -> EvalData:
    rng = np.random.default_rng(0)
    y_train, y_test = np.repeat(np.arange(4), 6), np.repeat(np.arange(4), 3)
    centers = rng.normal(size=(4, 5)) * 3
    X_train = centers[y_train] + rng.normal(size=(24, 5))
    X_test = centers[y_test] + rng.normal(size=(12, 5))
    return EvalData(y_train=y_train, X_test=X_test, y_test=y_test, n_classes=4, X_train=X_train)


DATA = _data()
TOKEN_DATA = as_tokens(DATA)  # for the protocols that read token features
DENSE_DATA = {task: dense_data(task) for task in ("segmentation", "normals")}  # spatial maps, per-pixel targets


def _data_for(name: str) -> EvalData:
    proto = get_protocol(name)
    return DENSE_DATA[proto.dense] if proto.dense else TOKEN_DATA if proto.tokens else DATA


@st.composite
def protocol_settings(draw, name: str | None = None):
    """A protocol that reads features (``name`` when given) and one or two of its settings, drawn."""
    name = name or draw(st.sampled_from(feature_protocols()))
    keys = list(get_protocol(name).defaults)
    chosen = draw(st.lists(st.sampled_from(keys), min_size=1, max_size=2, unique=True))
    if draw(st.integers(0, 9)) == 0:  # now and then an unknown setting
        chosen.append(draw(st.text("abcxyz_", min_size=1, max_size=6)))
    proto = get_protocol(name)
    return name, {k: draw(st.one_of(_typed(proto, k), _typed(proto, k), ANY_VALUE) if k in proto.defaults else ANY_VALUE) for k in chosen}


def _typed(proto, key: str):
    """Values of the setting's own type, so that many settings pass resolve_settings and run."""
    default = proto.defaults[key]
    if key in proto.choices:
        return st.sampled_from(proto.choices[key])
    if isinstance(default, bool):
        return st.booleans()
    if isinstance(default, int):
        return st.integers(-2, 12)
    if isinstance(default, float):
        return st.floats(-1, 3)
    if isinstance(default, list) or default == "default":
        return st.lists(st.integers(1, 12) | st.floats(0, 2), max_size=3)
    return st.just(default)


def _names(given_settings: dict) -> list[str]:
    out = list(given_settings)
    for v in given_settings.values():
        out += [repr(v)[:20], str(v)[:20]]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", feature_protocols())
@settings(max_examples=20, deadline=None)
@given(drawn=st.data())
def test_settings_are_refused_or_run_or_fail_clearly(tally, name, drawn):
    name, given_settings = drawn.draw(protocol_settings(name))
    full = {**cheap_settings(name), **given_settings}
    try:
        resolved = resolve_settings(name, full)
    except Exception:  # noqa: BLE001 - checked as a refusal below
        tally.expect_error("protocol settings: resolve_settings", lambda: resolve_settings(name, full),
                           _names(given_settings), kind=name)
        return
    tally.counts["protocol settings: accepted, then run"]["tried"] += 1
    try:
        get_protocol(name)(_data_for(name), resolved)
    except Exception:  # noqa: BLE001
        # settings valid on their own that do not fit these data: a data error, whose
        # message names the data problem (e.g. "n_way=5 needs at least 5 classes")
        tally.expect_error("protocol settings: accepted, then run",
                           lambda: get_protocol(name)(_data_for(name), resolved), None, kind=name)
        tally.counts["protocol settings: accepted, then run"]["tried"] -= 1  # counted once
    else:
        tally.counts["protocol settings: accepted, then run"]["ran"] += 1


@pytest.mark.parametrize("name", feature_protocols())
def test_cheap_settings_run(name):
    """Control: the base settings are valid, so refusals above come from the drawn values.

    The four classes of DATA are far apart: every protocol's headline (its primary metric)
    beats 0.25, the majority rate (a random ranking's mAP@R is far below it)."""
    entry = get_protocol(name)
    result = entry(_data_for(name), resolve_settings(name, cheap_settings(name)))
    numbers = {k: v for k, v in result.metrics.items() if isinstance(v, (int, float))}
    assert numbers and all(np.isfinite(v) for v in numbers.values()), result.metrics
    if entry.kind != "audit":
        assert 0.25 < numbers[entry.primary_metric] <= 1.0, result.metrics
    else:  # the invariance audit: one record per transform family, none violated on clean data
        assert result.metrics["records"] and numbers["violations"] == 0, result.metrics


@pytest.mark.parametrize(("name", "given_settings", "named"), [
    ("segmentation", {"weight_decay": 3.402823466385289e38}, "weight_decay"),  # what the property found
    ("normals", {"weight_decay": 1e31}, "weight_decay"),
    ("segmentation", {"learning_rates": [0.1, 1e39]}, "learning_rates"),
    ("mlp", {"learning_rate": 1e300}, "learning_rate"),
    ("mlp", {"weight_decays": [0.0, 1e40]}, "weight_decays"),
    ("attentive", {"learning_rates": [1e38]}, "learning_rates"),
    ("attentive", {"weight_decays": [2e30]}, "weight_decays"),
])
def test_an_optimizer_step_past_its_range_is_refused_before_any_work(name, given_settings, named):
    from pipeline.errors import ConfigError
    from pipeline.protocols.inputs.parameters import OPTIMIZER_MAX

    with pytest.raises(ConfigError, match=re.escape(named) + ".*" + re.escape(f"<= {OPTIMIZER_MAX:g}")):
        resolve_settings(name, {**cheap_settings(name), **given_settings})
    resolve_settings(name, {**cheap_settings(name), named: [OPTIMIZER_MAX] if named.endswith("s") else OPTIMIZER_MAX})


def test_a_fine_tuning_step_past_its_range_is_refused():
    from pipeline.errors import ConfigError
    from pipeline.protocols.finetune.settings import FinetuneSettings

    for given_settings in ({"lrs": (0.1, 1e39)}, {"weight_decays": (0.0, 1e31)}):
        with pytest.raises(ConfigError, match=f"{next(iter(given_settings))}: .*<= 1e\\+30"):
            FinetuneSettings(**given_settings)


def test_an_invariance_tolerance_no_fit_can_meet_is_refused():
    """The property drew logistic_tol = 1e-300: every audited fit ran its 10,000 iterations
    (minutes for 24 rows); 1e-12 takes about a second here."""
    from pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape("logistic_tol")):
        resolve_settings("invariance", {**cheap_settings("invariance"), "logistic_tol": 1e-300})
    resolve_settings("invariance", {**cheap_settings("invariance"), "logistic_tol": 1e-12})

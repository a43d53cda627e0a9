"""Leaderboard by mean rank, and the diff of two run summaries."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.stats import rankdata

from pipeline.errors import DataValidationError
from pipeline.analysis.leaderboard import diff_summaries, leaderboard
from pipeline.plain import to_plain

TABLE = {
    "vit": {"linear": 0.80, "fewshot": 0.60, "ece": 0.05},
    "resnet": {"linear": 0.80, "fewshot": 0.70, "ece": 0.03},
    "convnext": {"linear": 0.85, "fewshot": 0.55, "ece": 0.04},
    "mlp": {"linear": 0.50, "fewshot": 0.30, "ece": 0.20},
}


def test_mean_rank_hand_worked_with_ties_and_directions() -> None:
    rows = leaderboard(TABLE, higher_is_better={"ece": False})
    # linear: convnext 1, vit/resnet tied 2.5, mlp 4; fewshot: resnet 1, vit 2, convnext 3, mlp 4;
    # ece (lower is better): resnet 1, convnext 2, vit 3, mlp 4.
    expected = {"resnet": (2.5 + 1 + 1) / 3, "convnext": (1 + 3 + 2) / 3, "vit": (2.5 + 2 + 3) / 3, "mlp": 4.0}
    assert [r.model for r in rows] == ["resnet", "convnext", "vit", "mlp"]
    assert {r.model: r.mean_rank for r in rows} == pytest.approx(expected)
    assert rows[0].ranks == {"ece": 1.0, "fewshot": 1.0, "linear": 2.5}
    assert rows[0].scores == TABLE["resnet"] and rows[0].missing == ()
    json.dumps([to_plain(r) for r in rows])


def test_mean_rank_matches_scipy_rankdata() -> None:
    rng = np.random.default_rng(0)
    models, settings = [f"m{i}" for i in range(9)], [f"s{j}" for j in range(5)]
    scores = np.round(rng.random((9, 5)), 1)  # many ties
    rows = leaderboard({m: dict(zip(settings, scores[i])) for i, m in enumerate(models)})
    ranks = np.column_stack([rankdata(-scores[:, j], method="average") for j in range(5)])
    expected = dict(zip(models, ranks.mean(axis=1)))
    assert {r.model: r.mean_rank for r in rows} == pytest.approx(expected, rel=1e-12)
    means = [r.mean_rank for r in rows]
    assert means == sorted(means)


def test_missing_settings_exclude_or_last() -> None:
    table = {**TABLE, "new": {"linear": 0.9}}
    rows = leaderboard(table, higher_is_better={"ece": False})
    assert rows[-1].model == "new" and rows[-1].mean_rank is None and rows[-1].ranks == {}
    assert rows[-1].missing == ("ece", "fewshot")
    assert [r.model for r in rows[:-1]] == ["resnet", "convnext", "vit", "mlp"]
    last = {r.model: r for r in leaderboard(table, higher_is_better={"ece": False}, missing="last")}
    assert last["new"].ranks == {"linear": 1.0, "ece": 5.0, "fewshot": 5.0}
    assert last["resnet"].ranks["linear"] == 3.5
    both_missing = {"a": {"x": 1.0, "y": 1.0}, "b": {"x": 2.0}, "c": {"x": 3.0}}
    ranks = {r.model: r.ranks for r in leaderboard(both_missing, missing="last")}
    assert ranks["b"]["y"] == ranks["c"]["y"] == 2.5  # tied below the one model with a score


def test_leaderboard_input_errors() -> None:
    with pytest.raises(DataValidationError, match=r"Unknown missing policy 'drop'.*exclude, last"):
        leaderboard(TABLE, missing="drop")
    with pytest.raises(DataValidationError, match=r"score of 'vit' in setting 'linear' must be a finite number"):
        leaderboard({"vit": {"linear": float("nan")}})
    with pytest.raises(DataValidationError, match=r"unknown setting\(s\) \['acc'\]"):
        leaderboard(TABLE, higher_is_better={"acc": False})
    with pytest.raises(DataValidationError, match="empty"):
        leaderboard({})
    with pytest.raises(DataValidationError, match="no setting"):
        leaderboard({"vit": {}})


def _ok(score: float) -> dict:
    return {"status": "ok", "score": score}


def _failed(error: str) -> dict:
    return {"status": "failed", "error": error}


PREVIOUS = {
    "encoders": {
        "ckpt-100": {"cells": {"linear/cifar": _ok(0.70), "knn/cifar": _ok(0.60), "fewshot/pets": _failed("OOM")}},
        "ckpt-200": {"cells": {"linear/cifar": _ok(0.72), "knn/cifar": _failed("disk full")}},
        "old": {"cells": {"linear/cifar": _ok(0.5)}},
    },
    "regressions": [{"encoder": "ckpt-200", "cell": "knn/cifar", "against": "ckpt-100"}],
}
CURRENT = {
    "encoders": {
        "ckpt-100": {"cells": {"linear/cifar": _ok(0.70), "knn/cifar": _ok(0.61), "fewshot/pets": _failed("OOM"),
                               "linear/flowers": _ok(0.9)}},
        "ckpt-200": {"cells": {"linear/cifar": _ok(0.72), "knn/cifar": _ok(0.58)}},
        "ckpt-300": {"cells": {"linear/cifar": _ok(0.69), "knn/cifar": _failed("timeout")}},
    },
    "regressions": [
        {"encoder": "ckpt-200", "cell": "knn/cifar", "against": "ckpt-100"},
        {"encoder": "ckpt-300", "cell": "linear/cifar", "against": "ckpt-200", "p_adjusted": 0.01},
    ],
}


def test_diff_summaries_hand_worked() -> None:
    changes = diff_summaries(PREVIOUS, CURRENT)
    assert changes.new_encoders == ["ckpt-300"] and changes.removed_encoders == ["old"]
    assert changes.new_cells == ["linear/flowers"]
    assert changes.changed_scores == [
        {"encoder": "ckpt-100", "cell": "knn/cifar", "previous": 0.60, "current": 0.61, "change": pytest.approx(0.01)}]
    assert changes.regressions == [CURRENT["regressions"][1]]  # the old one was reported already
    assert changes.failures == [
        {"encoder": "ckpt-100", "cell": "fewshot/pets", "error": "OOM", "new": False},
        {"encoder": "ckpt-300", "cell": "knn/cifar", "error": "timeout", "new": True},
    ]
    assert changes.recovered == [{"encoder": "ckpt-200", "cell": "knn/cifar", "score": 0.58}]
    assert diff_summaries(PREVIOUS, CURRENT, tolerance=0.02).changed_scores == []
    assert json.loads(json.dumps(to_plain(changes)))["new_encoders"] == ["ckpt-300"]
    assert not changes.nothing_changed


def test_an_encoder_whose_weights_changed_is_new_not_a_change() -> None:
    """DINO's checkpoint.pth rewritten between two runs: its 34-point move is new weights."""
    before = {"encoders": {"checkpoint": {"weights": "adb180", "cells": {"knn/tex": _ok(0.80)}},
                           "ck0005": {"weights": "e1", "cells": {"knn/tex": _ok(0.60)}}}}
    after = {"encoders": {"checkpoint": {"weights": "ebf433", "cells": {"knn/tex": _ok(0.46)}},
                          "ck0005": {"weights": "e1", "cells": {"knn/tex": _ok(0.62)}}}}
    changes = diff_summaries(before, after)
    assert changes.new_encoders == ["checkpoint"] and changes.removed_encoders == [] and changes.new_cells == []
    assert [c["encoder"] for c in changes.changed_scores] == ["ck0005"]  # same weights: a change
    unsaid = {"encoders": {e: {"cells": v["cells"]} for e, v in after["encoders"].items()}}  # older summaries
    assert sorted(c["encoder"] for c in diff_summaries(before, unsaid).changed_scores) == ["checkpoint", "ck0005"]


def test_diff_of_a_run_with_itself_and_of_a_first_run() -> None:
    same = diff_summaries(PREVIOUS | {"regressions": []}, PREVIOUS | {"regressions": []})
    assert same.failures and all(not f["new"] for f in same.failures)
    healthy = {"encoders": {"a": {"cells": {"x": _ok(0.5)}}}}
    assert diff_summaries(healthy, healthy).nothing_changed
    first = diff_summaries(None, CURRENT)
    assert first.new_encoders == ["ckpt-100", "ckpt-200", "ckpt-300"] and first.removed_encoders == []
    assert first.new_cells == ["fewshot/pets", "knn/cifar", "linear/cifar", "linear/flowers"]
    assert len(first.regressions) == 2 and all(f["new"] for f in first.failures)


@pytest.mark.parametrize(
    ("summary", "message"),
    [
        ({"cells": {}}, "'encoders' dict"),
        ({"encoders": {"a": {"cells": {"x": {"status": "done"}}}}}, r"current\['encoders'\]\['a'\]\['cells'\]\['x'\]\['status'\].*ok, failed"),
        ({"encoders": {"a": {"cells": {"x": {"status": "ok", "score": None}}}}}, r"\['score'\] must be a finite number"),
        ({"encoders": {"a": []}}, r"\['a'\] must be a dict"),
        ({"encoders": {}, "regressions": {}}, "must be a list"),
        ({"encoders": {}, "regressions": [{"encoder": "a"}]}, r"\['regressions'\]\[0\]"),
    ],
)
def test_diff_refuses_malformed_summaries(summary: dict, message: str) -> None:
    with pytest.raises(DataValidationError, match=message):
        diff_summaries(None, summary)


def test_diff_refuses_negative_tolerance() -> None:
    with pytest.raises(DataValidationError, match="tolerance"):
        diff_summaries(None, CURRENT, tolerance=-0.1)

"""Dense metrics against direct formulas and scikit-learn; per-image counts that sum to the
set's metric; the paired comparison of two dense cells from those counts."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import confusion_matrix as sk_confusion
from sklearn.metrics import jaccard_score

from pipeline.analysis.compare.pixels import compare_pixel_counts
from pipeline.errors import DataValidationError
from pipeline.protocols.dense import metrics as dm


def _unit(v):
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def test_angular_errors_are_the_angles_between_unit_vectors_at_valid_pixels():
    rng = np.random.default_rng(0)
    gt = _unit(rng.normal(size=(3, 5, 7, 3)))
    gt[0, 0] = 0  # invalid pixels: the zero vector
    pred = rng.normal(size=gt.shape) * rng.uniform(0.1, 3, gt.shape[:-1] + (1,))  # any length
    pred[1, 2, 3] = gt[1, 2, 3] * 5  # exactly right: 0 degrees despite the clip
    pred[2, 1, 1] = -gt[2, 1, 1]  # exactly opposite: 180
    errors = dm.angular_errors(pred, gt)
    valid = np.linalg.norm(gt, axis=-1) > 0
    p, g = pred[valid], gt[valid]
    # another formula for the same angle: atan2(|p x g|, p . g)
    direct = np.degrees(np.arctan2(np.linalg.norm(np.cross(p, g), axis=1), np.einsum("ij,ij->i", p, g)))
    assert errors.shape == (valid.sum(),) and valid.sum() == 3 * 5 * 7 - 7
    np.testing.assert_allclose(errors, direct, atol=1e-6)
    m = dm.normals_metrics(errors)
    assert m["mean_angle_error"] == pytest.approx(direct.mean(), abs=1e-6)
    assert m["median_angle_error"] == pytest.approx(np.median(direct), abs=1e-6)
    for name, t in (("within_11_25", 11.25), ("within_22_5", 22.5), ("within_30", 30.0)):
        assert m[name] == np.mean(errors < t)
    with pytest.raises(DataValidationError, match="no valid normal"):
        dm.normals_metrics(np.array([]))


def test_miou_is_the_whole_sets_confusion_matrix_with_absent_classes_left_out():
    rng = np.random.default_rng(1)
    K = 6
    target = rng.integers(0, 4, (4, 9, 11)).astype(np.uint8)  # classes 4 and 5 never in the ground truth
    target[:, 0] = 255
    pred = rng.integers(0, 5, target.shape).astype(np.uint8)  # class 5 never predicted: absent from both
    conf = dm.confusion_matrix(pred, target, K, 255)
    keep = target.ravel() != 255
    np.testing.assert_array_equal(conf, sk_confusion(target.ravel()[keep], pred.ravel()[keep], labels=range(K)))
    m = dm.segmentation_metrics(conf)
    present = [0, 1, 2, 3, 4]  # class 4 is predicted, never true: IoU 0, counted
    expected = jaccard_score(target.ravel()[keep], pred.ravel()[keep], labels=present, average="macro")
    assert m["miou"] == pytest.approx(expected, abs=1e-12) and m["classes_scored"] == 5
    assert m["iou"][5] is None and m["iou"][4] == 0.0
    assert m["pixel_accuracy"] == np.mean(pred.ravel()[keep] == target.ravel()[keep])
    # not the mean of per-image mIoUs
    per_image = np.mean([dm.segmentation_metrics(dm.confusion_matrix(p, t, K, 255))["miou"]
                         for p, t in zip(pred, target)])
    assert per_image != pytest.approx(m["miou"], abs=1e-6)
    with pytest.raises(DataValidationError, match="no labelled pixel"):
        dm.segmentation_metrics(dm.confusion_matrix(pred, np.full_like(target, 255), K, 255))


def _seg_counts(pred, target, K):
    out = np.zeros((len(target), K, 3), dtype=np.int64)
    for i in range(len(target)):
        c = dm.confusion_matrix(pred[i], target[i], K, 255)
        tp = np.diag(c)
        out[i] = np.stack([tp, c.sum(0) - tp, c.sum(1) - tp], axis=1)
    return out


def test_summed_counts_give_the_sets_metrics():
    rng = np.random.default_rng(2)
    K = 5
    target = rng.integers(0, K, (6, 8, 8)).astype(np.uint8)
    pred = np.where(rng.random(target.shape) < 0.6, target, rng.integers(0, K, target.shape)).astype(np.uint8)
    m = dm.segmentation_metrics(dm.confusion_matrix(pred, target, K, 255))
    counts = _seg_counts(pred, target, K)
    assert dm.score_from_counts("miou", counts.sum(0)[None])[0] == pytest.approx(m["miou"], abs=1e-12)
    assert dm.score_from_counts("pixel_accuracy", counts.sum(0)[None])[0] == pytest.approx(m["pixel_accuracy"])
    errors = rng.uniform(0, 60, 500)
    normal_counts = np.array([[len(e), *(np.sum(e < t) for t in dm.ANGLE_THRESHOLDS)]
                              for e in np.split(errors, [100, 250, 400])])
    for name in ("within_11_25", "within_22_5", "within_30"):
        assert dm.score_from_counts(name, normal_counts.sum(0)[None])[0] == pytest.approx(
            dm.normals_metrics(errors)[name])
    with pytest.raises(DataValidationError, match="no per-image counts give metric 'median_angle_error'"):
        dm.score_from_counts("median_angle_error", normal_counts)


def test_paired_comparison_from_pixel_counts():
    rng = np.random.default_rng(3)
    K, n = 4, 40
    target = rng.integers(0, K, (n, 6, 6)).astype(np.uint8)
    good = np.where(rng.random(target.shape) < 0.8, target, rng.integers(0, K, target.shape)).astype(np.uint8)
    bad = np.where(rng.random(target.shape) < 0.4, target, rng.integers(0, K, target.shape)).astype(np.uint8)
    a, b = _seg_counts(good, target, K), _seg_counts(bad, target, K)
    out = compare_pixel_counts(a, b, "miou", n_resamples=300, n_permutations=299, seed=0)
    assert out.score_a == pytest.approx(dm.segmentation_metrics(dm.confusion_matrix(good, target, K, 255))["miou"])
    assert out.difference > 0.2 and out.ci_low > 0 and out.p_value == pytest.approx(1 / 300)
    # one bootstrap replicate recomputed directly: images drawn with replacement, counts summed
    from pipeline.analysis.compare.resampling import bootstrap_indices

    idx = bootstrap_indices(n, 300, 0)[0]
    direct = dm.score_from_counts("miou", a[idx].sum(0)[None]) - dm.score_from_counts("miou", b[idx].sum(0)[None])
    assert out.replicates[0] == pytest.approx(direct[0], abs=1e-12)
    same = compare_pixel_counts(a, a, "miou", n_resamples=50, n_permutations=49)
    assert same.difference == 0 and same.p_value == 1.0
    with pytest.raises(DataValidationError, match="same test images"):
        compare_pixel_counts(a, b[:-1], "miou")

"""What one cell hands a protocol and gets back: arrays, results, shapes."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import ConfigError
from pipeline.protocols.blocks import FeatureRows
from pipeline.protocols.evidence import Evidence

__all__ = ["ENCODER_LAYER", "Blocks", "CellShape", "EvalData", "Evidence", "ImageData", "ProtocolResult"]

#: The layer a cell of a protocol that reads the encoder's weights names: it works on the
#: encoder itself, at its pre-logits features.
ENCODER_LAYER = "pre_logits"

Blocks = Callable[[], Iterable[tuple[np.ndarray, int]]]


@dataclass(frozen=True)
class EvalData:
    """The arrays of one cell.

    Parameters
    ----------
    y_train, y_test, y_val : numpy.ndarray
        Class indices (n,), or (n, C) 0/1 arrays for multi-label data.
    X_test, X_val : numpy.ndarray
        Features (any float dtype; float16 is used as it is).
    n_classes : int
        Number of classes (columns of multi-label arrays).
    X_train : numpy.ndarray or None
        The train features in memory; may be None when ``train_blocks`` is given and the
        protocol ``streams_train``.
    train_blocks : callable or None
        Yields (row block, row offset) of the train features.
    mean_per_class : bool
        The dataset's headline metric is the mean per-class accuracy.
    """

    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    n_classes: int
    X_train: np.ndarray | None = None
    train_blocks: Blocks | None = None
    X_val: np.ndarray | None = None
    y_val: np.ndarray | None = None
    mean_per_class: bool = False

    @property
    def multilabel(self) -> bool:
        """Whether the labels are (n, C) indicator arrays."""
        return np.ndim(self.y_train) == 2

    def train_rows(self) -> FeatureRows:
        """The train features as ``FeatureRows`` (in memory, or streamed from ``train_blocks``).

        Returns
        -------
        FeatureRows
        """
        if self.X_train is not None:
            return FeatureRows.of(self.X_train)
        if self.train_blocks is None:
            raise ConfigError("EvalData needs X_train or train_blocks")
        return FeatureRows.of(blocks=self.train_blocks, n_rows=len(self.y_train), n_features=self.X_test.shape[1])

    def train(self) -> np.ndarray:
        """The train features as one array (read whole from ``train_blocks`` if needed).

        Returns
        -------
        numpy.ndarray
        """
        if self.X_train is not None:
            return self.X_train
        if self.train_blocks is None:
            raise ConfigError("EvalData needs X_train or train_blocks")
        return np.concatenate([b for b, _ in sorted(self.train_blocks(), key=lambda t: t[1])])


@dataclass(frozen=True)
class ImageData:
    """What one cell of a protocol that reads the encoder's weights works on.

    Parameters
    ----------
    encoder : EncoderSpec
        The encoder to build (``pipeline.encoders``).
    adapter : DatasetAdapter
        The dataset whose images it reads.
    train_split, test_split, val_split : str or None
        The dataset's splits (``val_split`` None: a share of train is held out).
    device : str
        Where it runs (``auto``, ``cpu``, ``cuda``, ``cuda:<i>``).
    scratch_dir : Path or None
        The cell's folder for resumable training state (one subfolder per part of it).
    """

    encoder: Any
    adapter: Any
    train_split: str = "train"
    test_split: str = "test"
    val_split: str | None = None
    device: str = "auto"
    scratch_dir: Path | None = None


@dataclass
class ProtocolResult:
    """What a protocol returns: headline and other metrics, diagnostics, warnings, time.

    Parameters
    ----------
    metrics : dict
        ``score`` (the headline) and others.
    diagnostics : dict
        Selected hyperparameters, convergence, the device used...
    warnings : list of dict
        ``{"code", "message"}`` (``pipeline.protocols.fit_warnings``): what makes the
        numbers doubtful (a grid edge, one predicted class, a chance score...) and the
        Python warnings raised during the run.
    seconds : float
        Wall time of the run.
    evidence : Evidence or None
        What a paired comparison of two encoders needs: the per-example test predictions
        (``Evidence.of_predictions``), multi-label scores (``of_scores``), per-episode
        accuracies (``of_episodes``) or every low-shot fit's predictions (``of_fits``).
        Optional: a protocol that returns none (the invariance audit) still records its
        cell, which comparisons then leave out, saying why.
    maps : numpy.ndarray or None
        A dense protocol's predictions for every test image at the targets' resolution
        (class maps or unit normals), stored beside the evidence.
    pictures : bytes or None
        Example pictures (PNG) kept beside the record (a diagnostic's maps).
    device_use : dict or None
        Where a protocol that reads images ran, its speed and peak memory (the record's
        ``gpu``).
    n_train, n_test : int or None
        Images it trained and was tested on (a protocol that reads images; a feature
        cell's come from its arrays).
    """

    metrics: dict[str, Any]
    diagnostics: dict[str, Any] = field(default_factory=dict)
    warnings: list[dict[str, str]] = field(default_factory=list)
    seconds: float = 0.0
    evidence: Evidence | None = None
    maps: np.ndarray | None = None
    pictures: bytes | None = None
    device_use: dict[str, Any] | None = None
    n_train: int | None = None
    n_test: int | None = None


@dataclass(frozen=True)
class CellShape:
    """Shapes of one cell, all a memory estimate needs."""

    n_train: int
    n_test: int
    n_val: int
    dim: int
    n_classes: int
    itemsize: int
    n_tokens: int = 1
    target_pixels: int = 0

    @property
    def feature_bytes(self) -> int:
        """Bytes of every split's features as stored."""
        return (self.n_train + self.n_test + self.n_val) * self.n_tokens * self.dim * self.itemsize

"""One evaluation cell, of any protocol: plain values, cheap to ship to a worker."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jobs.config import DatasetConfig, EncoderConfig
from pipeline.protocols.cell import ENCODER_LAYER
from pipeline.protocols.registry import Protocol, get_protocol

__all__ = ["ENCODER_LAYER", "Cell"]


@dataclass(frozen=True)
class Cell:
    """What to evaluate: one protocol setting on one (model, dataset, layer)."""
    # ``setting`` is the config's name of the protocol setting (``knn20``), ``protocol`` its
    # registry name (``knn``), ``settings`` the setting's values; ``encoder`` and
    # ``dataset_config`` are set for a protocol that reads the encoder's weights; ``identity``
    # says what the config's encoder and dataset are (``jobs.evaluation.encoder_identity``), which its
    # record keeps. Shipped to
    # a worker as ``pipeline.plain.to_plain(cell)``, rebuilt (and checked) by
    # ``jobs.config.typed.from_plain(Cell, plain)``.

    model: str
    dataset: str
    layer: str
    setting: str
    protocol: str
    settings: dict[str, Any] = field(default_factory=dict)
    train_split: str = "train"
    test_split: str = "test"
    val_split: str | None = None
    encoder: EncoderConfig | None = None
    dataset_config: DatasetConfig | None = None
    identity: str | None = None  # what its arrays hold: encoder and dataset (jobs.evaluation.encoder_identity); None: unknown
    encoder_identity: str | None = None  # the encoder's part alone (arrays of an older store record only it)

    @property
    def entry(self) -> Protocol:
        """The protocol's registry entry (it decides how the cell is identified and run)."""
        return get_protocol(self.protocol)

    def splits(self) -> list[str]:
        """The splits it reads: train, validation (if any) and test; the test split alone for
        a protocol that reads only it (a diagnostic)."""
        if self.entry.test_only:
            return [self.test_split]
        return [s for s in (self.train_split, self.val_split, self.test_split) if s]

    def label(self) -> str:
        """``model/dataset/layer:setting``, the cell's name in progress lines and failures."""
        return f"{self.model}/{self.dataset}/{self.layer}:{self.setting}"

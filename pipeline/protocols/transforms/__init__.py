"""Feature transforms (the ``transform`` setting): their names and one way to apply them."""

from __future__ import annotations

from typing import Any

from pipeline.protocols.blocks import FeatureRows

__all__ = ["TRANSFORM_NAMES", "apply_transform"]

#: The ``transform`` setting's choices: the names of ``transformers.TRANSFORMS``.
TRANSFORM_NAMES = ("none", "l2", "standardize", "whiten")


def apply_transform(name: str, train: FeatureRows, *rows: FeatureRows, device: Any = None,
                    **params: Any) -> tuple[FeatureRows, ...]:
    """Fit transform ``name`` on ``train`` and return each of ``rows`` followed by it.

    Parameters
    ----------
    name : str
        One of ``TRANSFORM_NAMES``.
    train : FeatureRows
        The rows the statistics are learnt from (the train split only).
    *rows : FeatureRows
        The rows to transform (train, validation, test, ...), each read through the
        fitted row map without a copy.
    device : torch.device or None
        Where the statistics are accumulated and the map's constants live (None: the CPU).
    **params
        The transformer's parameters (``eps`` for ``whiten``).

    Returns
    -------
    tuple of FeatureRows
        ``rows`` in their order, mapped; ``row_map`` of each is the fitted map (None for
        ``none``).
    """
    # deferred: torch and scikit-learn load when a transform is fitted, not when names are read
    from pipeline.protocols.transforms.transformers import fit_row_map

    row_map = fit_row_map(name, train, device, **params)
    return tuple(r.with_map(row_map) for r in rows)

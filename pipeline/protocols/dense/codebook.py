"""Surface normals as classification over clustered normals, the seed's formulation."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["CODEBOOK_SAMPLE", "FORMULATIONS", "codebook_loss", "decode_normals", "nearest_centre",
           "normal_codebook"]

#: ``classification`` (the seed's: clustered normals, cross-entropy) or ``regression``.
FORMULATIONS = ("classification", "regression")
#: Most valid training pixels the k-means codebook is fitted on.
CODEBOOK_SAMPLE = 100_000
_IGNORE = -100  # cross-entropy's ignore index: invalid pixels (the zero vector)


def normal_codebook(parts: Sequence[Any], rows: Sequence[np.ndarray], clusters: int, seed: int,
                    sample: int = CODEBOOK_SAMPLE) -> np.ndarray:
    """The k-means centres of a seeded sample of the valid training normals."""
    # deferred: scikit-learn loads only when a classification cell fits its codebook
    from sklearn.cluster import KMeans

    rng = np.random.default_rng([int(seed), 40])
    n_images = sum(len(r) for r in rows)
    per_image = max(1, -(-int(sample) // max(n_images, 1)))
    picked = []
    for part, chosen in zip(parts, rows):
        for i in np.sort(chosen):
            normals = np.asarray(part[int(i)], dtype=np.float64).reshape(-1, 3)
            valid = normals[np.abs(normals).sum(axis=1) > 0]
            if len(valid):
                picked.append(valid[rng.choice(len(valid), size=min(per_image, len(valid)), replace=False)])
    if not picked:
        raise ValueError("the training targets hold no valid normal: no codebook can be fitted")
    points = np.concatenate(picked)
    k = min(int(clusters), len(np.unique(points, axis=0)))
    return KMeans(n_clusters=k, n_init=1, random_state=int(seed)).fit(points).cluster_centers_


def nearest_centre(targets: Any, codebook: Any) -> Any:
    """Each pixel's nearest centre (Euclidean), ``_IGNORE`` where the normal is invalid."""
    import torch  # deferred: the registry imports this module without torch

    t = targets.to(torch.float32)
    # argmin |t - c|^2 = argmax 2 <t, c> - |c|^2
    labels = (2.0 * t @ codebook.T - (codebook * codebook).sum(dim=1)).argmax(dim=-1)
    return torch.where(t.abs().sum(dim=-1) > 0, labels, torch.full_like(labels, _IGNORE))


def codebook_loss(codebook: np.ndarray) -> Callable[[Any, Any], Any]:
    """Cross-entropy of the upsampled logits against each valid pixel's nearest centre."""
    import torch  # deferred: the registry imports this module without torch
    import torch.nn.functional as F  # deferred: as torch

    centres = torch.as_tensor(np.asarray(codebook), dtype=torch.float32)

    def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        labels = nearest_centre(targets, centres.to(targets.device))
        valid = (labels != _IGNORE).sum().clamp(min=1)
        return F.cross_entropy(outputs, labels, ignore_index=_IGNORE, reduction="sum") / valid
    return loss


def decode_normals(codebook: np.ndarray) -> Callable[[Any], Any]:
    """Upsampled logits to unit normals: the softmax-weighted sum of the centres, renormalised."""
    import torch  # deferred: the registry imports this module without torch
    import torch.nn.functional as F  # deferred: as torch

    centres = torch.as_tensor(np.asarray(codebook), dtype=torch.float32)

    def finish(outputs: torch.Tensor) -> torch.Tensor:
        mixed = torch.softmax(outputs, dim=1).permute(0, 2, 3, 1) @ centres.to(outputs.device)
        return F.normalize(mixed, dim=-1).to(torch.float16)
    return finish

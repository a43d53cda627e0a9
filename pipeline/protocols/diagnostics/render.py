"""PNG pictures of example saliency maps and reconstructions."""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from pipeline.errors import DataValidationError

__all__ = ["render_reconstructions_png", "render_saliency_png"]

_TILE_INCHES = 1.6


def _check_images(images: Any, name: str) -> np.ndarray:
    arr = np.asarray(images)
    if arr.ndim != 4 or arr.shape[-1] != 3 or arr.shape[0] == 0:
        raise DataValidationError(f"{name} must be a non-empty (k, H, W, 3) array, got shape {arr.shape}")
    return arr


def _png(rows: list[list[tuple[np.ndarray, str, str | None]]], dpi: int) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n_rows, n_cols = len(rows), max(len(r) for r in rows)
    fig = Figure(figsize=(_TILE_INCHES * n_cols, _TILE_INCHES * n_rows), dpi=dpi)
    FigureCanvasAgg(fig)
    for r, row in enumerate(rows):
        for c, (tile, title, cmap) in enumerate(row):
            ax = fig.add_subplot(n_rows, n_cols, r * n_cols + c + 1)
            ax.imshow(tile, cmap=cmap, interpolation="nearest")
            ax.set_title(title, fontsize=7)
            ax.axis("off")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def render_saliency_png(images: Any, maps: Any, dpi: int = 100) -> bytes:
    """Images (top row) over their saliency maps (bottom row, each scaled to its own range).

    Parameters
    ----------
    images : uint8 or [0, 1] float (k, H, W, 3).
    maps : (k, H, W) saliency.
    dpi : resolution of the PNG.

    Returns
    -------
    bytes
        PNG file contents.
    """
    imgs = _check_images(images, "images")
    sal = np.asarray(maps, dtype=np.float64)
    if sal.shape != imgs.shape[:3]:
        raise DataValidationError(f"maps must be (k, H, W) = {imgs.shape[:3]} to match the images, got {sal.shape}")
    top = [(img, f"image {i}", None) for i, img in enumerate(imgs)]
    bottom = []
    for i, m in enumerate(sal):
        span = m.max() - m.min()
        bottom.append(((m - m.min()) / span if span > 0 else np.zeros_like(m), f"saliency {i}", "inferno"))
    return _png([top, bottom], dpi)


def render_reconstructions_png(originals: Any, reconstructions: Any, dpi: int = 100) -> bytes:
    """Originals (top row) over their reconstructions from the features (bottom row).

    Parameters
    ----------
    originals, reconstructions : uint8 or [0, 1] float (k, H, W, 3) of one shape.
    dpi : resolution of the PNG.

    Returns
    -------
    bytes
        PNG file contents.
    """
    a, b = _check_images(originals, "originals"), _check_images(reconstructions, "reconstructions")
    if a.shape != b.shape:
        raise DataValidationError(f"originals {a.shape} and reconstructions {b.shape} must have one shape")
    return _png([[(img, f"original {i}", None) for i, img in enumerate(a)],
                 [(img, f"reconstruction {i}", None) for i, img in enumerate(b)]], dpi)

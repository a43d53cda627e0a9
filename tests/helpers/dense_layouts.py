"""Tiny copies of the dense datasets in their publishers' layouts, generated.

- :func:`write_ade20k`: ``ADEChallengeData2016/images/{training,validation}/*.jpg``,
  ``annotations/...png`` (8-bit, 0 = other objects, 1..150) and ``objectInfo150.txt``;
- :func:`write_voc_segmentation`: ``VOCdevkit/VOC2012/JPEGImages``, palette PNGs in
  ``SegmentationClass`` (255 on object boundaries), ``ImageSets/Segmentation/{train,val}.txt``;
- :func:`write_nyuv2`: ``splits.mat`` (trainNdxs, testNdxs), ``images/<i>.png``,
  ``normals/<i>.png`` (8-bit RGB, n = v / 255 * 2 - 1) and ``masks/<i>.png``.

Each image is a few rectangles whose colour follows their label (class or normal), so
pixels carry their targets; images are small (32-64 px) so tests stay fast. Every file gets
one fixed modification time, so two copies written alike share their fingerprints.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image

# A colour per class (segmentation) and the six axis normals (normals), for the rectangles.
CLASS_COLOURS = np.array([[200, 40, 40], [40, 200, 40], [40, 40, 200], [200, 200, 40], [200, 40, 200],
                          [40, 200, 200]], dtype=np.uint8)


FIXED_NS = 1_600_000_000 * 10**9


def freeze(root: Path) -> Path:
    """Give every file under ``root`` the modification time :data:`FIXED_NS`; returns ``root``."""
    for folder, _, files in os.walk(root):
        for name in files:
            os.utime(os.path.join(folder, name), ns=(FIXED_NS, FIXED_NS))
    return root


def _label_layout(rng: np.random.Generator, height: int, width: int, values: list[int], block: int = 16) -> np.ndarray:
    """A map of ``block`` x ``block`` tiles, each labelled with one of ``values`` at random."""
    tiles = rng.choice(values, size=(-(-height // block), -(-width // block)))
    return np.kron(tiles, np.ones((block, block), dtype=np.int64))[:height, :width]


def _image_of(labels: np.ndarray, colours: dict[int, np.ndarray], rng: np.random.Generator) -> np.ndarray:
    img = np.zeros((*labels.shape, 3), dtype=np.float64)
    for value, colour in colours.items():
        img[labels == value] = colour
    return np.clip(img + rng.normal(0, 6, img.shape), 0, 255).astype(np.uint8)


def write_ade20k(root: Path, n_train: int = 6, n_val: int = 4, size: tuple[int, int] = (48, 64),
                 classes: tuple[int, ...] = (1, 2, 3, 4), seed: int = 0) -> Path:
    """An ``ADEChallengeData2016`` folder under ``root``; returns ``root``.

    Parameters
    ----------
    root : Path
    n_train, n_val : int
        Images per split.
    size : tuple of int
        (height, width).
    classes : tuple of int
        Annotation values used (1..150); 0 ("other objects") fills every fifth tile.
    seed : int
    """
    rng = np.random.default_rng(seed)
    base = root / "ADEChallengeData2016"
    colours = {v: CLASS_COLOURS[i % len(CLASS_COLOURS)] for i, v in enumerate(classes)}
    colours[0] = np.array([128, 128, 128], dtype=np.uint8)
    for split, folder, n in (("train", "training", n_train), ("val", "validation", n_val)):
        (base / "images" / folder).mkdir(parents=True)
        (base / "annotations" / folder).mkdir(parents=True)
        for i in range(1, n + 1):
            labels = _label_layout(rng, *size, [0, *classes] if i % 5 == 0 else list(classes))
            stem = f"ADE_{split}_{i:08d}"
            Image.fromarray(_image_of(labels, colours, rng)).save(base / "images" / folder / f"{stem}.jpg",
                                                                  quality=95)
            Image.fromarray(labels.astype(np.uint8), mode="L").save(base / "annotations" / folder / f"{stem}.png")
    rows = ["Idx\tRatio\tTrain\tVal\tName"] + [f"{k}\t0.01\t10\t1\tthing{k};other{k}" for k in range(1, 151)]
    (base / "objectInfo150.txt").write_text("\n".join(rows) + "\n")
    return freeze(root)


def write_voc_segmentation(root: Path, n_train: int = 5, n_val: int = 3, size: tuple[int, int] = (40, 48),
                           seed: int = 0) -> Path:
    """A ``VOCdevkit/VOC2012`` segmentation folder under ``root``; returns ``root``."""
    rng = np.random.default_rng(seed)
    base = root / "VOCdevkit" / "VOC2012"
    for folder in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        (base / folder).mkdir(parents=True)
    palette = np.zeros((256, 3), dtype=np.uint8)
    palette[:21] = rng.integers(0, 255, (21, 3))
    palette[255] = [224, 224, 192]
    colours = {v: CLASS_COLOURS[i] for i, v in enumerate((0, 8, 12, 15))}
    for split, n in (("train", n_train), ("val", n_val)):
        ids = [f"2007_{split}{i:04d}" for i in range(n)]
        for image_id in ids:
            labels = _label_layout(rng, *size, list(colours))
            Image.fromarray(_image_of(labels, colours, rng)).save(base / "JPEGImages" / f"{image_id}.jpg", quality=95)
            labels[:, ::16] = 255  # object boundaries
            png = Image.fromarray(labels.astype(np.uint8), mode="P")
            png.putpalette(palette.ravel().tolist())
            png.save(base / "SegmentationClass" / f"{image_id}.png")
        (base / "ImageSets" / "Segmentation" / f"{split}.txt").write_text("\n".join(ids) + "\n")
    return freeze(root)


AXIS_NORMALS = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [-1, 0, 0], [0, -1, 0], [0, 0, -1]], dtype=np.float64)


def encode_normals(normals: np.ndarray) -> np.ndarray:
    """8-bit RGB of unit normals, ``round((n + 1) / 2 * 255)``."""
    return np.round((normals + 1.0) / 2.0 * 255.0).astype(np.uint8)


def write_nyuv2(root: Path, train: tuple[int, ...] = (1, 3, 4, 6, 7, 9), test: tuple[int, ...] = (2, 5, 8, 10),
                size: tuple[int, int] = (48, 64), seed: int = 0, masks: bool = True) -> Path:
    """The NYUv2 surface-normal layout under ``root`` (1-based frame indices); returns ``root``."""
    from scipy.io import savemat

    rng = np.random.default_rng(seed)
    for folder in ("images", "normals", "masks") if masks else ("images", "normals"):
        (root / folder).mkdir(parents=True)
    colours = {k: CLASS_COLOURS[k] for k in range(len(AXIS_NORMALS))}
    for frame in (*train, *test):
        labels = _label_layout(rng, *size, list(colours))
        normals = AXIS_NORMALS[labels]
        valid = np.ones(size, dtype=bool)
        valid[: size[0] // 6] = False  # the top rows have no depth, hence no normal
        Image.fromarray(_image_of(labels, colours, rng)).save(root / "images" / f"{frame:04d}.png")
        rgb = encode_normals(normals)
        rgb[~valid] = 0
        Image.fromarray(rgb).save(root / "normals" / f"{frame:04d}.png")
        if masks:
            Image.fromarray((valid * 255).astype(np.uint8)).save(root / "masks" / f"{frame:04d}.png")
    savemat(root / "splits.mat", {"trainNdxs": np.array(train, dtype=np.float64)[:, None],
                                  "testNdxs": np.array(test, dtype=np.float64)[:, None]})
    return freeze(root)

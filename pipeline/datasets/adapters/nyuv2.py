"""NYU Depth v2's labelled set with the surface-normal ground truth of the normal-estimation
literature: per-image normal maps and validity masks, the official 795 / 654 split."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.datasets.registry import register_dataset
from pipeline.datasets.adapters.dense import DenseDataset, image_ids, read_png
from pipeline.datasets.layout import locate, read_lines, under
from pipeline.datasets.listing import Listing
from pipeline.datasets.adapters.oxford import load_mat
from pipeline.errors import DatasetError

__all__ = ["NYU_LABELLED", "Nyuv2NormalsDataset", "decode_normals"]

#: Frames of the labelled set; the split files index them from 1.
NYU_LABELLED = 1449
#: A decoded normal shorter than this is no direction (an invalid pixel written as grey or black).
MIN_LENGTH = 0.5
_SPLITS = {"train": ("trainNdxs", "train.txt"), "test": ("testNdxs", "test.txt")}


def decode_normals(rgb: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """Unit normals from an 8-bit RGB normal map: ``n = value / 255 * 2 - 1``, rescaled to unit
    length; the zero vector where ``mask`` is 0 or the decoded vector is shorter than 0.5."""
    n = rgb.astype(np.float64) / 255.0 * 2.0 - 1.0
    length = np.linalg.norm(n, axis=-1, keepdims=True)
    valid = length >= MIN_LENGTH
    if mask is not None:
        valid &= (mask != 0)[..., None]
    return np.where(valid, n / np.maximum(length, 1e-12), 0.0).astype(np.float32)


def _split_indices(base: Path) -> tuple[dict[str, list[int]], str]:
    """The official split as 1-based frame indices: ``splits.mat`` (trainNdxs, testNdxs), else
    ``train.txt`` and ``test.txt`` (one index per line); each a whole number in range, listed
    once, and no frame in both splits (refused otherwise, naming the file)."""
    if (base / "splits.mat").is_file():
        mat = load_mat(base / "splits.mat", "nyuv2_normals")
        missing = [k for k, _ in _SPLITS.values() if k not in mat]
        if missing:
            raise DatasetError(f"nyuv2_normals: {str(base / 'splits.mat')!r} lacks {missing[0]!r}; it must hold "
                               "trainNdxs and testNdxs")
        source = repr(str(base / "splits.mat"))
        out = {s: _whole_numbers(mat[k], f"{source} ({k})") for s, (k, _) in _SPLITS.items()}
        return _checked_split(out, source), source
    out = {}
    for split, (_, name) in _SPLITS.items():
        lines = read_lines(base / name, "nyuv2_normals")
        try:
            out[split] = [int(line.split()[0]) for line in lines]
        except ValueError:
            raise DatasetError(f"nyuv2_normals: {str(base / name)!r} must list one frame index per line") from None
    source = f"{str(base / 'train.txt')!r} and {str(base / 'test.txt')!r}"
    return _checked_split(out, source), source


def _whole_numbers(values: object, where: str) -> list[int]:
    """Frame indices from a MATLAB array: every value a whole number (9.5 is not truncated to 9)."""
    array = np.ravel(np.asarray(values))
    if array.dtype.kind not in "iuf":
        raise DatasetError(f"nyuv2_normals: {where} holds {array.dtype} values; it must hold frame indices")
    if array.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(array) | (array != np.round(array)))
        if bad.size:
            raise DatasetError(f"nyuv2_normals: {where} holds {float(array[bad[0]])!r} at position {bad[0] + 1} "
                               f"({bad.size} such value(s)); frame indices are whole numbers 1 to {NYU_LABELLED}")
    return [int(v) for v in array]


def _checked_split(indices: dict[str, list[int]], source: str) -> dict[str, list[int]]:
    """Each split's frames in range and listed once, and no frame in both splits."""
    for split, frames in indices.items():
        bad = [i for i in frames if not 1 <= i <= NYU_LABELLED]
        if bad:
            raise DatasetError(f"nyuv2_normals: {source} lists frame {bad[0]} in {split}; frames are 1 to "
                               f"{NYU_LABELLED}")
        seen: set[int] = set()
        twice = [i for i in frames if i in seen or seen.add(i)]  # type: ignore[func-returns-value]
        if twice:
            raise DatasetError(f"nyuv2_normals: {source} lists frame {twice[0]} twice in {split} "
                               f"({len(twice)} repeat(s)); each frame is listed once")
    shared = sorted(set(indices["train"]) & set(indices["test"]))
    if shared:
        raise DatasetError(f"nyuv2_normals: {source} lists {len(shared)} frame(s) in both train and test (frame "
                           f"{shared[0]} first); a probe trained on test frames would score them as unseen")
    return indices


@register_dataset("nyuv2_normals")
class Nyuv2NormalsDataset(DenseDataset):
    """NYU Depth v2 labelled frames with surface normals (Ladicky et al.'s ground truth).

    Reads, under ``root`` (or its ``nyuv2`` folder): ``splits.mat`` (NYU's ``trainNdxs``,
    795 frames, and ``testNdxs``, 654; 1-based indices of the 1,449 labelled frames), or
    ``train.txt`` and ``test.txt`` with one index per line; ``images/<index>.png`` (or
    .jpg) the RGB frames; ``normals/<index>.png`` the normals as 8-bit RGB, ``n = value /
    255 * 2 - 1``; ``masks/<index>.png`` the validity masks (nonzero: valid). ``<index>``
    may be zero-padded (``0001``) or not. Without a ``masks`` folder a pixel is valid where
    its decoded normal is at least 0.5 long. Splits ``train`` and ``test``.
    """

    dense_task = "normals"
    metric = "angular"

    def _read(self, root: Path) -> dict[str, Listing]:
        base = locate(root, "normals", [".", "nyuv2"], "nyuv2_normals")
        self.class_names = ["surface normal"]
        indices, source = _split_indices(base)
        prefix = under(root, base)
        folders = {"images": image_ids(base / "images", "nyuv2_normals"),
                   "normals": image_ids(base / "normals", "nyuv2_normals")}
        masked = (base / "masks").is_dir()
        if masked:
            folders["masks"] = image_ids(base / "masks", "nyuv2_normals")
        by_index = {kind: _by_index(files, kind) for kind, files in folders.items()}
        listings = {}
        for split, frames in indices.items():
            for kind, files in by_index.items():
                lacking = [i for i in frames if i not in files]
                if lacking:
                    raise DatasetError(f"nyuv2_normals: frame {lacking[0]} of {split} has no file in "
                                       f"{str(base / kind)!r} ({len(lacking)} frame(s) lack one)")
            ids = [f"{i:04d}" for i in frames]
            kinds = [kind for kind in ("normals", "masks") if kind in by_index]
            self._target_files[split] = {
                f"{i:04d}": tuple(f"{prefix}/{kind}/{by_index[kind][i]}" for kind in kinds) for i in frames}
            listings[split] = self.listing(ids, [f"{prefix}/images/{by_index['images'][i]}" for i in frames], source)
        return listings

    def _decode_target(self, paths: list[str]) -> np.ndarray:
        img = read_png(paths[0], "nyuv2_normals")
        if img.mode != "RGB":
            raise DatasetError(f"nyuv2_normals: normal map {paths[0]!r} has mode {img.mode}; it must be 8-bit RGB")
        mask = None
        if len(paths) > 1:
            mask = np.asarray(read_png(paths[1], "nyuv2_normals").convert("L"))
            if mask.shape != img.size[::-1]:  # either may be the wrong one: both named
                raise DatasetError(f"nyuv2_normals: normal map {paths[0]!r} is {img.size[0]} x {img.size[1]} pixels "
                                   f"but its mask {paths[1]!r} is {mask.shape[1]} x {mask.shape[0]}; a frame's "
                                   "image, normal map and mask must have one size")
        return decode_normals(np.asarray(img), mask)


def _by_index(files: dict[str, str], kind: str) -> dict[int, str]:
    """Frame index -> file name of a folder whose file stems are (zero-padded) indices."""
    out: dict[int, str] = {}
    for stem, name in files.items():
        if stem.isdigit():
            if int(stem) in out:
                raise DatasetError(f"nyuv2_normals: {kind} has two files for frame {int(stem)}: "
                                   f"{out[int(stem)]!r} and {name!r}")
            out[int(stem)] = name
    return out

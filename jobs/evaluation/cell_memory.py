"""How much memory each evaluation cell needs, and whether some Dask worker can hold it."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.encoders.spec import MAP_DTYPE, TOKENS_DTYPE, is_map_layer, layer_kind
from pipeline.errors import CellTooLargeError, ConfigError
from pipeline.protocols.registry import get_protocol
from storage_schema import feature_key

log = logging.getLogger(__name__)

#: The Dask worker resource evaluation tasks ask for, in bytes.
MEMORY_RESOURCE = "MEMORY"
#: Share of a worker's memory limit it declares as ``MEMORY``: the rest holds the worker's
#: own libraries (torch, numpy: about 0.5 GiB) and keeps it below Dask's pause at 80 %.
MEMORY_SHARE = 0.75

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(value: int | float | str, what: str = "size") -> int:
    """Bytes of ``value``: a number, or a string such as ``"12 GiB"``, ``"500MB"``."""
    if isinstance(value, bool):
        raise ConfigError(f"{what}: {value!r} is not a size; give bytes or e.g. '8GiB'")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([kmgt]i?b|b)?\s*", str(value), flags=re.IGNORECASE)
        if match is None:
            raise ConfigError(f"{what}: {value!r} is not a size; give bytes or e.g. '8GiB', '500MB'")
        number, unit = float(match.group(1)), (match.group(2) or "").lower()
    if number <= 0:
        raise ConfigError(f"{what}: {value!r} must be more than 0 bytes")
    return int(number * _UNITS[unit])


def format_bytes(n: float) -> str:
    """``n`` bytes in a readable unit (``1.5 GiB``)."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def declared_memory(memory_limit: int) -> int:
    """The ``MEMORY`` resource a worker with ``memory_limit`` bytes declares."""
    return int(memory_limit * MEMORY_SHARE)


@dataclass(frozen=True)
class SplitShape:
    """Rows, width and bytes per value of one split's features; classes of its labels;
    tokens (or map cells) per row; pixels of one image's per-pixel targets (dense)."""

    rows: int
    dim: int | None
    itemsize: int
    n_classes: int
    n_tokens: int = 1
    target_pixels: int = 0


def stored_split_shape(store, model: str, dataset: str, split: str, layer: str) -> SplitShape | None:
    """The shape of a stored feature array and its labels (None when either is absent)."""
    feats = store.status(feature_key(model, dataset, split, layer))
    if feats is None or len(feats.shape) not in (2, 3, 4):
        return None
    labels_key = feats.attrs.get("labels")
    labels = store.status(labels_key) if labels_key else None
    if labels is None:
        return None
    n_classes = labels.shape[1] if len(labels.shape) == 2 else len(labels.attrs.get("class_names") or ()) or 2
    pixels = int(np.prod(labels.shape[1:3])) if labels.attrs.get("kind") == "targets" else 0
    return SplitShape(int(feats.shape[0]), int(feats.shape[-1]), np.dtype(feats.dtype).itemsize, int(n_classes),
                      int(np.prod(feats.shape[1:-1])), pixels)


def cell_bytes(cell, shapes: Mapping[str, SplitShape]) -> int | None:
    """Peak memory of ``cell`` from the shapes of its splits (None when a width is unknown)."""
    train, test = shapes[cell.train_split], shapes[cell.test_split]
    val = shapes.get(cell.val_split) if cell.val_split else None
    if train.dim is None:
        return None
    return get_protocol(cell.protocol).memory_bytes(
        train.rows, test.rows, val.rows if val else 0, train.dim, max(train.n_classes, test.n_classes),
        max(train.itemsize, test.itemsize), cell.settings, n_tokens=train.n_tokens,
        target_pixels=max(train.target_pixels, test.target_pixels))


def estimate_cells(cells: Sequence, encoders: Iterable, adapters: Mapping[str, Any], store=None,
                   default_dtype: str = "float32") -> dict[str, int | None]:
    """The peak memory of every cell (by label), before anything is extracted."""
    by_name = {e.name: e for e in encoders}
    widths: dict[tuple, tuple | None] = {}  # by architecture: checkpoints of one share it
    shapes: dict[tuple[str, str, str, str], SplitShape | None] = {}

    def shape(model: str, dataset: str, split: str, layer: str) -> SplitShape | None:
        key = (model, dataset, split, layer)
        if key not in shapes:
            shapes[key] = stored_split_shape(store, *key) if store is not None else None
            enc, adapter = by_name.get(model), adapters.get(dataset)
            if shapes[key] is None and enc is not None and enc.extracted and adapter is not None:
                arch = (enc.arch, tuple(enc.layers), enc.input_size)
                if arch not in widths:
                    widths[arch] = _meta_widths(enc)
                layer_shapes, crop = widths[arch] or ({}, (0, 0))
                shape = layer_shapes.get(layer)
                stored = {"tokens": TOKENS_DTYPE, "map": MAP_DTYPE}.get(layer_kind(layer), enc.dtype or default_dtype)
                itemsize = np.dtype(stored).itemsize
                pixels = crop[0] * crop[1] if is_map_layer(layer) and adapter.dense_task else 0
                shapes[key] = SplitShape(adapter.num_samples(split), None if shape is None else shape[-1], itemsize,
                                         len(adapter.class_names), int(np.prod(shape[:-1])) if shape else 1, pixels)
        return shapes[key]

    out: dict[str, int | None] = {}
    for cell in cells:
        if not cell.entry.reads_features:
            continue  # it reads the encoder's weights and asks for a GPU, not for memory
        split_shapes = {s: shape(cell.model, cell.dataset, s, cell.layer) for s in cell.splits()}
        out[cell.label()] = None if any(v is None for v in split_shapes.values()) else cell_bytes(cell, split_shapes)
    return out


def _meta_widths(encoder) -> tuple[dict[str, tuple[int, ...]], tuple[int, int]] | None:
    """(shape of one image's features per layer, input crop (H, W)) on the meta device."""
    # deferred: timm and torch load when an encoder's shapes are needed, not when the config checks a memory
    # size
    from pipeline.encoders import meta_encoder

    try:
        meta = meta_encoder(encoder.spec())
        if meta is None:
            return None
        return meta.feature_shapes(), tuple(int(v) for v in meta.data_config["input_size"][1:])
    except Exception as exc:  # noqa: BLE001  unknown widths are sized once extracted, not refused
        log.info("feature widths of %s not known before extraction: %s", encoder.name, exc)
        return None


def task_bytes(labels: Iterable[str], needs: Mapping[str, int | None]) -> int | None:
    """What one task running ``labels`` one after another needs: the largest of them."""
    known = [needs[label] for label in labels if needs.get(label) is not None]
    return max(known) if known else None


def check_cells_fit(needs: Mapping[str, int | None], capacities: Sequence[int], where: str) -> None:
    """Refuse, with the numbers, cells that need more memory than every worker declares."""
    if not capacities:
        return
    largest = max(capacities)
    too_big = sorted(((n, label) for label, n in needs.items() if n is not None and n > largest), reverse=True)
    if not too_big:
        return
    shown = "; ".join(f"{label} needs {format_bytes(n)} ({n} bytes)" for n, label in too_big[:5])
    more = f" (and {len(too_big) - 5} more)" if len(too_big) > 5 else ""
    raise CellTooLargeError(
        f"{len(too_big)} cell(s) need more memory than any worker of {where} holds: {shown}{more}; the largest "
        f"worker offers {MEMORY_RESOURCE}={format_bytes(largest)} ({largest} bytes). Give workers more memory (dask.memory_limit, fewer dask.n_workers, or `dask worker "
        "--memory-limit ... --resources MEMORY=...`), store the features as float16 (dtype: float16), or "
        "narrow the protocol (fewer test rows, episodes or shots)")

"""The forward pass as the store lays it out, shared by extraction and repair.

A chunk is a whole number of batches and no batch straddles two chunks, so the rows of any
chunk come from exactly the batches an uninterrupted extraction fed the model: a resumed
or repaired chunk is bitwise what a single run writes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from pipeline.datasets import DatasetAdapter, TorchImageDataset
from pipeline.encoders import Encoder, EncoderSpec
from pipeline.encoders.spec import TOKENS_DTYPE, is_token_layer
from storage_schema import array_fingerprint


def layer_dtype(layer: str, dtype: str) -> str:
    """The stored dtype of ``layer``: the extraction's, or float16 for token features.

    Parameters
    ----------
    layer : str
        A layer name.
    dtype : str
        The extraction's dtype.

    Returns
    -------
    str
    """
    return TOKENS_DTYPE if is_token_layer(layer) else dtype


def layer_fingerprints(encoder: Encoder, dataset_fingerprint: str, split: str, dtype: str) -> dict[str, str]:
    """The fingerprint of each requested layer's array: what its rows depend on.

    Parameters
    ----------
    encoder : Encoder
        The loaded encoder (its weights fingerprint, data config and pooling count).
    dataset_fingerprint : str
        The split's fingerprint.
    split : str
        The split's name.
    dtype : str
        The extraction's dtype (token layers: float16, see :func:`layer_dtype`).

    Returns
    -------
    dict
        Layer name -> array fingerprint.
    """
    pooling = encoder.layer_pooling()
    return {
        layer: array_fingerprint(
            weights_fingerprint=encoder.weights_fingerprint, data_config=encoder.data_config,
            layer=layer, pooling=pooling[layer], dataset_fingerprint=dataset_fingerprint, split=split,
            dtype=layer_dtype(layer, dtype), arch=encoder.spec.arch,
            compute_precision="float16-autocast" if encoder.autocast else "float32",
        )
        for layer in encoder.layers
    }


def recorded_spec(spec: EncoderSpec) -> dict:
    """The spec as stored with an array for ``repeval repair``.

    A checkpoint is recorded by its absolute path (the weights fingerprint in the array's
    provenance tells whether the file still holds the same weights).

    Parameters
    ----------
    spec : EncoderSpec
        The encoder's spec.

    Returns
    -------
    dict
        JSON-able fields of the spec.
    """
    out = spec.to_dict()
    if spec.weights_kind == "checkpoint":
        out["weights"] = str(Path(spec.weights).expanduser().resolve())
    return out


def chunk_batches(chunks: Sequence[int], n: int, chunk_rows: int, batch_size: int) -> list[list[int]]:
    """Row indices of every batch of the given chunks, in order; batches never straddle chunks.

    Parameters
    ----------
    chunks : sequence of int
        Chunk indices.
    n : int
        Rows in the split.
    chunk_rows : int
        Rows per chunk (a multiple of ``batch_size``, or the whole split).
    batch_size : int
        Rows per batch.

    Returns
    -------
    list of list of int
        One list of row indices per batch.
    """
    batches = []
    for c in chunks:
        start, stop = c * chunk_rows, min((c + 1) * chunk_rows, n)
        batches.extend(list(range(s, min(s + batch_size, stop))) for s in range(start, stop, batch_size))
    return batches


def batch_loader(dataset: DatasetAdapter, split: str, encoder: Encoder, batches: list[list[int]],
                 num_workers: int = 0) -> DataLoader:
    """A DataLoader yielding ``(images, row indices)`` for exactly ``batches``.

    Parameters
    ----------
    dataset : DatasetAdapter
        The dataset.
    split : str
        The split.
    encoder : Encoder
        Gives the preprocessing and the device.
    batches : list of list of int
        Row indices per batch (from :func:`chunk_batches`).
    num_workers : int
        DataLoader worker processes decoding images.

    Returns
    -------
    torch.utils.data.DataLoader
        The loader.
    """
    return DataLoader(
        TorchImageDataset(dataset, split, encoder.transform()), batch_sampler=batches,
        num_workers=num_workers, pin_memory=encoder.device.type == "cuda", persistent_workers=False,
        # its own generator: each iterator draws a seed, which from torch's global RNG could
        # land inside another thread's seeded model initialisation
        generator=torch.Generator(),
    )


def forward_chunks(encoder: Encoder, dataset: DatasetAdapter, split: str, chunks: Sequence[int], *,
                   chunk_rows: int, batch_size: int, dtype: str, num_workers: int = 0,
                   on_batch: Callable[[int], None] | None = None) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """Run the encoder over the rows of ``chunks`` and yield each chunk once it is whole.

    Parameters
    ----------
    encoder : Encoder
        The loaded encoder; every layer it extracts is yielded.
    dataset : DatasetAdapter
        The dataset.
    split : str
        The split.
    chunks : sequence of int
        The chunks to compute, in increasing order.
    chunk_rows, batch_size : int
        The array's rows per chunk and the extraction's rows per batch.
    dtype : str
        The dtype of the yielded rows (token layers: float16, see :func:`layer_dtype`).
    num_workers : int
        DataLoader worker processes.
    on_batch : callable, optional
        Called with the number of images of every batch after its forward pass.

    Yields
    ------
    tuple
        ``(chunk, {layer: rows})`` with every row of the chunk.
    """
    n = dataset.num_samples(split)
    loader = batch_loader(dataset, split, encoder, chunk_batches(chunks, n, chunk_rows, batch_size), num_workers)
    out_dtype = {layer: np.dtype(layer_dtype(layer, dtype)) for layer in encoder.layers}
    buffers: dict[str, list[np.ndarray]] = {layer: [] for layer in encoder.layers}
    for images, index in loader:
        feats = encoder.forward(images)
        if on_batch is not None:
            on_batch(len(index))
        for layer in encoder.layers:
            buffers[layer].append(feats[layer].astype(out_dtype[layer], copy=False))
        last_row = int(index[-1])
        chunk = last_row // chunk_rows
        if last_row + 1 == min((chunk + 1) * chunk_rows, n):  # the chunk is whole: hand it over
            yield chunk, {layer: np.concatenate(parts) for layer, parts in buffers.items()}
            buffers = {layer: [] for layer in encoder.layers}


def iter_batches_for_benchmark(dataset: DatasetAdapter, split: str, encoder: Encoder,
                               batch_size: int) -> Iterator[torch.Tensor]:
    """The batches of images extraction feeds the model, for a bare-loop comparison.

    Parameters
    ----------
    dataset : DatasetAdapter
        The dataset.
    split : str
        The split.
    encoder : Encoder
        Gives the preprocessing.
    batch_size : int
        Rows per batch.

    Yields
    ------
    torch.Tensor
        One preprocessed batch of images.
    """
    n = dataset.num_samples(split)
    batches = chunk_batches(list(range(-(-n // batch_size))), n, batch_size, batch_size)
    for images, _ in batch_loader(dataset, split, encoder, batches):
        yield images

"""The forward pass as the store lays it out, shared by extraction and repair."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from pipeline.datasets import DatasetAdapter, TorchImageDataset
from pipeline.datasets.torch_dataset import EncodedImageDataset, collate_encoded
from pipeline.encoders import Encoder, EncoderSpec
from pipeline.encoders.device_preprocess import DevicePreprocess, device_transform_steps
from pipeline.encoders.spec import MAP_DTYPE, TOKENS_DTYPE, is_map_layer, is_token_layer
from pipeline.plain import to_plain
from pipeline.protocols.inputs.devices import available_cores
from storage_schema import array_fingerprint

log = logging.getLogger(__name__)


def layer_dtype(layer: str, dtype: str) -> str:
    """The stored dtype of ``layer``: the extraction's, or float16 for token features and maps."""
    return TOKENS_DTYPE if is_token_layer(layer) else MAP_DTYPE if is_map_layer(layer) else dtype


def map_attrs(layer: str, shape: Sequence[int], data_config: dict) -> dict:
    """What a map layer's array records beside its provenance: its grid (h, w), the input it
    covers (H, W) and the stride between grid cells in input pixels; nothing for other layers."""
    if not is_map_layer(layer):
        return {}
    h, w = int(shape[0]), int(shape[1])
    height, width = int(data_config["input_size"][1]), int(data_config["input_size"][2])
    return {"grid": [h, w], "input_size": [height, width], "stride": [height / h, width / w]}


def layer_fingerprints(encoder: Encoder, dataset_fingerprint: str, split: str, dtype: str,
                       decode: str = "pil") -> dict[str, str]:
    """The fingerprint of each requested layer's array: what its rows depend on."""
    pooling = encoder.layer_pooling()
    return {
        layer: array_fingerprint(
            weights_fingerprint=encoder.weights_fingerprint, data_config=encoder.data_config,
            layer=layer, pooling=pooling[layer], dataset_fingerprint=dataset_fingerprint, split=split,
            dtype=layer_dtype(layer, dtype), arch=encoder.spec.arch, compute_precision=encoder.compute_precision,
            decode=decode,
        )
        for layer in encoder.layers
    }


def loader_settings(num_workers: int | str, pin_memory: bool | str, device: torch.device) -> tuple[int, bool]:
    """DataLoader worker processes and pinning: ``auto`` is none on the CPU; on a GPU, one
    worker per core this process may use (shared between the machine's GPUs, at most 16)
    and pinned batches (their copies to the GPU do not block)."""
    gpu = device.type == "cuda"
    if num_workers == "auto":
        num_workers = min(16, max(1, available_cores() // max(1, torch.cuda.device_count()))) if gpu else 0
    return int(num_workers), (gpu if pin_memory == "auto" else bool(pin_memory))


def decode_mode(requested: str, dataset: DatasetAdapter, encoder: Encoder) -> str:
    """``device`` where asked and possible (image files, a transform with a tensor form), else ``pil``."""
    if requested != "device":
        return "pil"
    if not dataset.has_image_files:
        log.info("%s (%s) has no image files: decoded with PIL", dataset.name, dataset.adapter)
        return "pil"
    steps = device_transform_steps(encoder.data_config)
    if isinstance(steps, str):
        log.info("%s: %s; decoded with PIL", encoder.spec.name, steps)
        return "pil"
    return "device"


def recorded_spec(spec: EncoderSpec) -> dict:
    """The spec as stored with an array for ``repeval repair``."""
    # A checkpoint is recorded by its absolute path (the weights fingerprint in the array's
    # provenance tells whether the file still holds the same weights).
    out = to_plain(spec)
    if spec.weights_kind == "checkpoint":
        out["weights"] = str(Path(spec.weights).expanduser().resolve())
    return out


def chunk_batches(chunks: Sequence[int], n: int, chunk_rows: int, batch_size: int) -> list[list[int]]:
    """Row indices of every batch of the given chunks, in order; batches never straddle chunks."""
    batches = []
    for c in chunks:
        start, stop = c * chunk_rows, min((c + 1) * chunk_rows, n)
        batches.extend(list(range(s, min(s + batch_size, stop))) for s in range(start, stop, batch_size))
    return batches


def batch_loader(dataset: DatasetAdapter, split: str, encoder: Encoder, batches: list[list[int]],
                 num_workers: int = 0, pin_memory: bool | None = None, decode: str = "pil") -> DataLoader:
    """A DataLoader yielding ``(images, row indices)`` for exactly ``batches``."""
    if decode == "device":
        items, collate = EncodedImageDataset(dataset, split), collate_encoded
    else:
        items, collate = TorchImageDataset(dataset, split, encoder.transform()), None
    return DataLoader(
        items, batch_sampler=batches, collate_fn=collate, num_workers=num_workers,
        pin_memory=encoder.device.type == "cuda" if pin_memory is None else pin_memory, persistent_workers=False,
        # its own generator: each iterator draws a seed, which from torch's global RNG could
        # land inside another thread's seeded model initialisation
        generator=torch.Generator(),
    )


@dataclass(frozen=True)
class KnownRows:
    """Rows of a split whose features an earlier pass already computed (the early pass):
    extraction copies them instead of passing their images through the encoder again."""

    rows: np.ndarray
    features: dict[str, np.ndarray]
    source: str


def chunk_plan(chunks: Sequence[int], n: int, chunk_rows: int, batch_size: int,
               known: np.ndarray | None = None) -> list[tuple[int, list[list[int]]]]:
    """Each chunk with the batches of its rows to compute: its rows not in ``known``, in
    order, cut into batches of ``batch_size``; batches never straddle chunks."""
    # Without ``known`` these are exactly :func:`chunk_batches`' batches. With it, a resumed
    # or repaired chunk is fed the same batches as long as the same rows are known.
    taken = set() if known is None else set(np.asarray(known).tolist())
    plan = []
    for c in chunks:
        rows = [r for r in range(c * chunk_rows, min((c + 1) * chunk_rows, n)) if r not in taken]
        plan.append((c, [rows[s:s + batch_size] for s in range(0, len(rows), batch_size)]))
    return plan


def forward_chunks(encoder: Encoder, dataset: DatasetAdapter, split: str, chunks: Sequence[int], *,
                   chunk_rows: int, batch_size: int, dtype: str, num_workers: int = 0,
                   on_batch: Callable[[int], None] | None = None, pin_memory: bool | None = None,
                   decode: str = "pil", known: KnownRows | None = None) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """Run the encoder over the rows of ``chunks`` and yield each chunk once it is whole."""
    # The device works one batch ahead: a batch's features are copied back without
    # blocking while the next batch is read, decoded and queued, and are only waited for
    # afterwards (on the CPU everything is synchronous and the rows are the same). Rows in
    # ``known`` are copied into their chunks, not computed (:func:`chunk_plan`).
    n = dataset.num_samples(split)
    plan = chunk_plan(chunks, n, chunk_rows, batch_size, None if known is None else known.rows)
    batches = [b for _, bs in plan for b in bs]
    out_dtype = {layer: np.dtype(layer_dtype(layer, dtype)) for layer in encoder.layers}
    assembler = _Chunks(plan, n, chunk_rows, out_dtype, known)
    yield from assembler.ready()
    if not batches:
        return
    loader = batch_loader(dataset, split, encoder, batches, num_workers, pin_memory, decode)
    preprocess = None
    if decode == "device":
        preprocess = DevicePreprocess(encoder.data_config, encoder.device,
                                      lambda i: dataset.load_image(split, i))

    def finish(pending) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        host, done, index = pending
        if done is not None:
            done.synchronize()
        assembler.add(index.numpy(), {layer: host[layer].float().numpy() for layer in encoder.layers})
        yield from assembler.ready()

    pending = None
    for images, index in loader:
        if preprocess is not None:
            images = preprocess(images, index.tolist())
        feats = encoder.forward_tensors(images)
        host = {layer: t.to("cpu", non_blocking=True) for layer, t in feats.items()}
        done = None
        if encoder.device.type == "cuda":
            done = torch.cuda.Event()
            done.record()
        if on_batch is not None:
            on_batch(len(index))
        if pending is not None:
            yield from finish(pending)
        pending = (host, done, index)
    if pending is not None:
        yield from finish(pending)


class _Chunks:
    """Chunks being filled, in order: known rows copied in first, computed rows as their
    batches arrive; a chunk is handed over once every row is there."""

    def __init__(self, plan, n: int, chunk_rows: int, out_dtype: dict[str, np.dtype], known: KnownRows | None):
        self.plan, self.n, self.chunk_rows, self.out_dtype, self.known = list(plan), n, chunk_rows, out_dtype, known
        self.at = -1
        self.buffers: dict[str, np.ndarray] | None = None
        self.missing = 0
        self._next()

    def _next(self) -> None:
        self.at += 1
        self.buffers = None
        if self.at >= len(self.plan):
            return
        chunk, batches = self.plan[self.at]
        self.start = chunk * self.chunk_rows
        self.stop = min(self.start + self.chunk_rows, self.n)
        self.missing = sum(len(b) for b in batches)
        self.buffers = {}
        if self.known is not None:
            inside = (self.known.rows >= self.start) & (self.known.rows < self.stop)
            self.known_at = (self.known.rows[inside] - self.start, np.flatnonzero(inside))
        for layer, dt in self.out_dtype.items():
            self.buffers[layer] = None  # allocated with the first rows (their shape is the layer's)
            if self.known is not None and self.known_at[0].size:
                self._put(layer, self.known_at[0], self.known.features[layer][self.known_at[1]])

    def _put(self, layer: str, offsets: np.ndarray, rows: np.ndarray) -> None:
        if self.buffers[layer] is None:
            self.buffers[layer] = np.empty((self.stop - self.start, *rows.shape[1:]), dtype=self.out_dtype[layer])
        self.buffers[layer][offsets] = rows.astype(self.out_dtype[layer], copy=False)

    def add(self, index: np.ndarray, feats: dict[str, np.ndarray]) -> None:
        offsets = np.asarray(index, dtype=np.int64) - self.start
        for layer, rows in feats.items():
            self._put(layer, offsets, rows)
        self.missing -= len(offsets)

    def ready(self) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        while self.buffers is not None and self.missing == 0:
            yield self.plan[self.at][0], dict(self.buffers)
            self._next()


def iter_batches_for_benchmark(dataset: DatasetAdapter, split: str, encoder: Encoder,
                               batch_size: int) -> Iterator[torch.Tensor]:
    """The batches of images extraction feeds the model, for a bare-loop comparison."""
    n = dataset.num_samples(split)
    batches = chunk_batches(list(range(-(-n // batch_size))), n, batch_size, batch_size)
    for images, _ in batch_loader(dataset, split, encoder, batches):
        yield images

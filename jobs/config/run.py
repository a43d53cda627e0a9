"""How a run executes: the ``extract:`` section (batching, the forward pass's precision
and memory format, DataLoader workers, where images are decoded, the stored dtype) and the
``dask:`` section (where tasks run)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from jobs.evaluation.cell_memory import parse_bytes
from pipeline.errors import ConfigError
from storage_schema.leases import DEFAULT_TTL

__all__ = ["DECODERS", "DTYPES", "PRECISIONS", "DaskSettings", "ExtractConfig", "repeval_home"]

def repeval_home() -> Path:
    """repeval's own folder for state outside a store (``$REPEVAL_HOME``, default
    ``~/.cache/repeval``): Prefect's home in the embedded mode, scratch space of encoder
    protocols when the store is not a local folder."""
    return Path(os.environ.get("REPEVAL_HOME", Path.home() / ".cache" / "repeval"))


DTYPES = ("float32", "float16")  # of stored features
PRECISIONS = ("auto", "float32", "float16", "bfloat16")  # of the forward pass (autocast)
DECODERS = ("pil", "device")  # where image files are decoded and resized


@dataclass(frozen=True)
class ExtractConfig:
    """How to run an extraction. The stored numbers depend on ``dtype``, ``precision``,
    ``channels_last`` and ``decode`` (each is in the features' fingerprint); the rest
    only changes how fast they come.

    The config's ``extract:`` section, and what ``jobs.extraction.extract.extract`` takes.
    ``auto`` values: on a CUDA device, float16 autocast, channels-last for convolutional
    models, one DataLoader worker per core (at most 16, the cores shared between the
    machine's GPUs) and pinned memory; on the CPU, float32, the default memory format,
    no worker processes and no pinning (the features stay bitwise what they were).

    Parameters
    ----------
    batch_size, chunk_batches : int
        Images per forward pass; batches per stored chunk.
    num_workers : int or "auto"
        DataLoader worker processes reading and decoding images.
    dtype : str
        The stored dtype (``DTYPES``).
    device : str or None
        The torch device (None: CUDA if available, else the CPU).
    lease_ttl : float
        Seconds without a heartbeat after which a writer counts as dead.
    wait : bool
        Wait for another process holding the lease (else move on).
    progress : bool
        Show a progress bar.
    precision : str
        The forward pass's autocast dtype (``PRECISIONS``).
    channels_last, pin_memory : bool or "auto"
        The memory format of convolutional models; page-locked batches.
    decode : str
        Where images are decoded (``DECODERS``).
    scratch_dir : str or None
        Training state of encoder protocols (None: under a local store, else ``$REPEVAL_HOME``).
    """

    batch_size: int = 64
    chunk_batches: int = 4  # rows per chunk = batch_size * chunk_batches
    num_workers: int | str = "auto"  # DataLoader worker processes reading and decoding images
    dtype: str = "float32"
    device: str | None = None  # torch device; default: cuda if available, else cpu
    lease_ttl: float = DEFAULT_TTL  # seconds without heartbeat after which a writer counts as dead
    wait: bool = True  # another process holds the lease: wait for it (True) or move on
    progress: bool = True  # a progress bar (runs turn it off: their tasks report progress)
    precision: str = "auto"  # autocast dtype of the forward pass
    channels_last: bool | str = "auto"
    pin_memory: bool | str = "auto"  # page-locked batches: non-blocking copies to the GPU
    # pil: decode and resize with PIL in the loader (timm's transform); device: JPEG files
    # decoded (nvJPEG on a GPU, libjpeg on the CPU) and resized on the extraction device
    decode: str = "pil"
    # Resumable training state of encoder protocols (fine-tuning); default: under the store
    # when it is a local folder, else $REPEVAL_HOME/scratch
    scratch_dir: str | None = None

    def validate(self) -> None:
        """Refuse a bad dtype, batch, worker count, precision, decoder or lease time."""
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype {self.dtype!r} is not supported; choose one of {', '.join(DTYPES)}")
        for name in ("batch_size", "chunk_batches"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.num_workers != "auto" and (isinstance(self.num_workers, bool) or not isinstance(self.num_workers, int)
                                           or self.num_workers < 0):
            raise ConfigError(f"num_workers must be an integer >= 0 or 'auto', got {self.num_workers!r}")
        for name, choices in (("precision", PRECISIONS), ("decode", DECODERS),
                              ("channels_last", (True, False, "auto")), ("pin_memory", (True, False, "auto"))):
            value = getattr(self, name)
            if not any(value is c or (isinstance(c, str) and value == c) for c in choices):
                raise ConfigError(f"{name} {value!r} is not one of {', '.join(map(str, choices))}")
        if not (isinstance(self.lease_ttl, (int, float)) and self.lease_ttl > 0):  # 0: every lease stale at once
            raise ConfigError(f"lease_ttl must be a number of seconds > 0, got {self.lease_ttl!r}")

    def check(self, path: str) -> None:
        """``validate``, each message naming the field's path in the config.

        Parameters
        ----------
        path : str
            Where the entry sits in the config (``encoders[0]``), for the messages.
        """
        try:
            self.validate()
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None


@dataclass
class DaskSettings:
    """Where tasks run: a LocalCluster by default, or an existing scheduler.

    Parameters
    ----------
    address : str or None
        An existing scheduler (``tcp://scheduler:8786``); None: a LocalCluster.
    n_workers, threads_per_worker : int
        The LocalCluster's workers and their threads.
    processes : bool
        Worker processes (False: threads of one process).
    gpu : str
        Whether extraction tasks ask for a GPU worker: ``auto``, ``always`` or ``never``.
    cells_per_task : int
        Cells of one (encoder, dataset) evaluated per task.
    memory_limit : int or str
        Memory of each local worker (bytes, ``8GiB`` or ``auto``).
    math_threads : int or str
        Threads of each task's math (``auto``: the cores shared by every worker thread).
    """

    address: str | None = None  # e.g. tcp://scheduler:8786
    n_workers: int = 2
    threads_per_worker: int = 1
    processes: bool = True  # worker processes (isolation); False: threads in one process
    gpu: str = "auto"  # extraction tasks ask for a GPU worker resource: auto | always | never
    # Cells of one (encoder, dataset) evaluated per task: submitting a task costs a few
    # hundred ms of Prefect/Dask bookkeeping, so tiny cells are grouped.
    cells_per_task: int = 16
    # Memory of each embedded LocalCluster worker: bytes, "8GiB", or auto (the machine's
    # memory shared by the workers). Each declares 75 % of it as its MEMORY resource, and
    # evaluation tasks ask for what their cells need (jobs.evaluation.cell_memory).
    memory_limit: int | str = "auto"
    # Threads of each task's math (torch, BLAS) in local worker processes. Dask starts them
    # with OMP_NUM_THREADS=1, so one large cell would use one core of many. auto: the
    # machine's cores shared by every worker thread, at most OMP_NUM_THREADS where it is set.
    math_threads: int | str = "auto"

    def check(self, path: str) -> None:
        """Refuse a bad GPU mode, memory limit, worker count, task size or thread count.

        Parameters
        ----------
        path : str
            Where the entry sits in the config (``encoders[0]``), for the messages.
        """
        if self.gpu not in ("auto", "always", "never"):
            raise ConfigError(f"{path}.gpu: {self.gpu!r} is not one of 'auto', 'always', 'never'")
        if self.memory_limit != "auto":
            parse_bytes(self.memory_limit, f"{path}.memory_limit")
        if self.n_workers < 1 or self.threads_per_worker < 1:
            raise ConfigError(f"{path}: n_workers and threads_per_worker must be >= 1")
        if self.cells_per_task < 1:
            raise ConfigError(f"{path}.cells_per_task: {self.cells_per_task} must be >= 1")
        if self.math_threads != "auto" and (isinstance(self.math_threads, bool)
                                            or not isinstance(self.math_threads, int) or self.math_threads < 1):
            raise ConfigError(f"{path}.math_threads: {self.math_threads!r} must be 'auto' or an integer >= 1")

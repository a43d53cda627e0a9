"""One error hierarchy for repeval."""

from __future__ import annotations

from difflib import get_close_matches
from collections.abc import Iterable


class RepevalError(Exception):
    """Base class of every error repeval raises on purpose."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0]) if self.args else self.__class__.__name__


class ConfigError(RepevalError, ValueError):
    """A configuration value is wrong; the message names the field's path."""


class CellTooLargeError(ConfigError):
    """An evaluation cell needs more memory than any worker of the cluster holds."""


class InvalidNameError(RepevalError, ValueError):
    """A name used in a store key is empty, path-like or has control characters."""


class UnknownNameError(RepevalError, ValueError):
    """A registry lookup (architecture, dataset adapter, protocol, layer) failed."""


class DataValidationError(RepevalError, ValueError):
    """Input arrays are unusable: NaN/Inf, mismatched lengths, too few classes..."""


class CheckpointError(RepevalError, ValueError):
    """A checkpoint cannot be loaded: unreadable, wrong format, mismatched keys."""


class UnsafeCheckpointError(CheckpointError):
    """A pickle checkpoint would need to run arbitrary code; it is refused."""


class WeightsChangedError(RepevalError, RuntimeError):
    """A checkpoint file changed between planning and loading, or while it was read: what
    was loaded is not what the run planned; its features are left for the next scan."""


class WeightsMismatchError(RepevalError, ValueError):
    """The feature arrays of a cell (or a record and its arrays) came from different weights."""


class HubUnavailableError(RepevalError, RuntimeError):
    """Pretrained weights are not in the local hub cache and the hub is offline."""


class DatasetError(RepevalError, ValueError):
    """A dataset cannot be read as declared."""


class CorruptImageError(DatasetError):
    """An image file cannot be decoded; the message names the file."""


class StoreError(RepevalError, RuntimeError):
    """The feature store is in a state that forbids the operation."""


class SchemaVersionError(StoreError):
    """The store was written by another schema version."""


class ReadOnlyStoreError(RepevalError, PermissionError):
    """A write was attempted on a store opened read-only (or on a read-only file system)."""


class StoreFullError(StoreError, OSError):
    """The store's disk or quota is full, or a file size limit was hit, while writing."""


class ArrayNotFoundError(RepevalError, KeyError, FileNotFoundError):
    """No array at that key; the message lists what the store holds nearby."""


class RecordNotFoundError(RepevalError, KeyError):
    """No bookkeeping record (ledger record, failure record) under that id in the store."""


class IncompleteArrayError(StoreError):
    """The array exists but not every chunk has been written yet."""


class CorruptChunkError(StoreError):
    """A stored chunk fails its checksum; the message names the array and the chunk."""


class StaleArrayError(StoreError):
    """The stored array was made from other weights, preprocessing or data."""


class LeaseHeldError(StoreError):
    """Another live process holds the write lease of that array."""


class LeaseLostError(StoreError):
    """Our lease expired and another process took it over; we must stop writing."""


def unknown_name(kind: str, name: object, choices: Iterable[str]) -> UnknownNameError:
    """Build an error for an unknown registry name, suggesting close valid names."""
    choices = sorted(set(choices))
    close = get_close_matches(str(name), choices, n=5, cutoff=0.6)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    shown = ", ".join(choices[:30]) + (f", ... ({len(choices)} in all)" if len(choices) > 30 else "")
    return UnknownNameError(f"Unknown {kind} {name!r}.{hint} Valid choices: {shown}")

"""The storages a PyTorch pickle declares, checked against what its file holds."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from pipeline.errors import CheckpointError
from pipeline.terminal import short


class Global(NamedTuple):
    """A global a pickle names (``GLOBAL`` or ``STACK_GLOBAL``): module and attribute."""

    module: str
    name: str


# bytes per element of each storage type torch writes; the only modules torch.load accepts them from
_ELEMENT_SIZES = {"Double": 8, "Float": 4, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1,
                  "Byte": 1, "Bool": 1, "ComplexDouble": 16, "ComplexFloat": 8, "QInt8": 1, "QUInt8": 1,
                  "QInt32": 4, "QUInt4x2": 1, "QUInt2x4": 1, "Untyped": 1}
_MODULES = ("torch", "torch.cuda", "torch.storage")


def element_size(storage_type: Global) -> int | None:
    """Bytes per element of a storage type (``torch FloatStorage``), None for any other global."""
    if storage_type.module not in _MODULES or not storage_type.name.endswith("Storage"):
        return None
    return _ELEMENT_SIZES.get(storage_type.name[:-len("Storage")])


def declared_storage(pid: object, unknown: object, name: str) -> tuple[object, int] | None:
    """The key and bytes of the storage a persistent id declares, from the values the replay kept."""
    if not isinstance(pid, tuple) or not pid or pid[0] not in ("storage", b"storage") or len(pid) not in (5, 6):
        if pid is unknown or (isinstance(pid, tuple) and unknown in pid[:1]):
            raise CheckpointError(f"Refusing checkpoint {name!r}: a persistent id that is not a plain tuple of "
                                  "values (torch.save never writes one); its storage's size cannot be checked")
        return None  # not a storage: torch.load refuses it
    storage_type, key, numel = pid[1], pid[2], pid[4]
    if not isinstance(storage_type, Global) or not isinstance(numel, int) or not isinstance(key, (str, bytes)):
        raise CheckpointError(f"Refusing checkpoint {name!r}: a storage whose type, key or size is not written as "
                              "a plain value (torch.save never writes one); its size cannot be checked")
    size = element_size(storage_type)
    if size is None:
        return None  # not a storage type: torch.load refuses the global
    return key, max(numel, 0) * size


def check_storage_sizes(path: Path, storages: dict[object, int], file_size: int | None = None,
                        records: dict[str, int] | None = None, prefix: str = "") -> None:
    """Refuse storages larger than a legacy file, or unlike their archive records."""
    if file_size is not None:
        total = sum(storages.values())
        if total > file_size:
            raise CheckpointError(
                f"Refusing checkpoint {path.name!r}: its pickle declares {len(storages):,} storage(s) of "
                f"{total:,} bytes in all, but the file holds {file_size:,} bytes (torn, or crafted to make "
                "torch allocate memory for weights it does not hold)")
    for key, nbytes in (storages.items() if records is not None else ()):
        record = f"{prefix}data/{key}"  # how torch names it
        held = records.get(record)  # type: ignore[union-attr]
        if held != nbytes:
            holds = "does not hold that record" if held is None else f"holds {held:,} bytes there"
            raise CheckpointError(
                f"Refusing checkpoint {path.name!r}: its pickle declares storage {short(key)} of {nbytes:,} bytes, "
                f"but the archive {holds} (a damaged or crafted file: its weights would be read from other bytes)")

"""What a checkpoint file is, told from a bounded prefix of its bytes (and a zip's directory)."""

from __future__ import annotations

import os
import struct
import zipfile
from pathlib import Path

_TAR_BLOCK = 512
# magic bytes of compressed files: named in the message instead of "not a checkpoint"
COMPRESSED = ((b"\x1f\x8b", "gzip"), (b"\xfd7zXZ\x00", "xz"), (b"BZh", "bzip2"), (b"\x28\xb5\x2f\xfd", "zstd"),
              (b"\x04\x22\x4d\x18", "lz4"))


def container_format(path: str | os.PathLike[str]) -> str | None:
    """What a file holds, from its first bytes: ``safetensors``, ``torch-zip`` (torch.save's
    archive), ``pickle`` (a legacy torch.save or plain pickle), ``torch-tar`` (torch.save's
    oldest format), a compression (``gzip``, ``xz``, ``bzip2``, ``zstd``, ``lz4``) or None."""
    # At most 512 bytes from the start are read, and a zip's end-of-archive record.
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(_TAR_BLOCK)
    if head[:4] == b"PK\x03\x04":
        return "torch-zip"
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "pickle"
    # a safetensors header's length, then its JSON: the length may exceed a torn file's size
    if len(head) >= 9 and head[8:9] == b"{" and struct.unpack("<Q", head[:8])[0] < 1 << 30:
        return "safetensors"
    for magic, name in COMPRESSED:
        if head.startswith(magic):
            return name
    if is_tar_header(head):
        return "torch-tar"
    if zipfile.is_zipfile(path):  # a zip with something before its first record: its directory is at the end
        return "torch-zip"
    return None


def is_tar_header(block: bytes) -> bool:
    """Whether ``block`` (a file's first 512 bytes) is a tar header: its checksum adds up."""
    if len(block) < _TAR_BLOCK or not block.strip(b"\x00"):
        return False
    field = block[148:156].replace(b"\x00", b" ").strip()
    try:
        stored = int(field, 8)
    except ValueError:
        return False
    unsigned = sum(block[:148]) + 8 * 0x20 + sum(block[156:_TAR_BLOCK])
    signed = sum(b - 256 if b > 127 else b for b in block[:148] + block[156:_TAR_BLOCK]) + 8 * 0x20
    return stored in (unsigned, signed)

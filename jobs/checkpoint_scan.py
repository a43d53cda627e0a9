"""Turn checkpoint folders into encoders: what the nightly schedule evaluates.

Each file matching a scan's pattern becomes an encoder named ``<name_prefix><file stem>``.
A sidecar ``<stem>.json`` may carry ``{"reference_score": 0.71}`` (e.g. the source-task
accuracy the trainer measured), which becomes that encoder's reference score.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

from jobs.config import BenchmarkConfig, CheckpointScan, EncoderConfig

_UNSAFE = re.compile(r"[^A-Za-z0-9_.+=@-]")


def encoder_name(scan: CheckpointScan, path: Path) -> str:
    return _UNSAFE.sub("_", f"{scan.name_prefix}{path.stem}").lstrip(".-+=@") or "checkpoint"


def scan_folder(scan: CheckpointScan) -> list[tuple[EncoderConfig, float | None]]:
    """Encoders (and sidecar reference scores) for every checkpoint in ``scan.path``, sorted."""
    folder = Path(scan.path)
    if not folder.is_dir():
        return []
    out = []
    for path in sorted(folder.glob(scan.pattern)):
        enc = EncoderConfig(name=encoder_name(scan, path), arch=scan.arch, weights=str(path),
                            layers=list(scan.layers), input_size=scan.input_size)
        sidecar = path.with_suffix(".json")
        score = None
        if sidecar.is_file():
            score = json.loads(sidecar.read_text()).get("reference_score")
        out.append((enc, score))
    return out


def with_scanned_checkpoints(cfg: BenchmarkConfig) -> BenchmarkConfig:
    """A copy of ``cfg`` whose encoders include every scanned checkpoint (config wins on names)."""
    out = copy.deepcopy(cfg)
    names = {e.name for e in out.encoders}
    for scan in out.checkpoints:
        for enc, score in scan_folder(scan):
            if enc.name in names:
                continue
            out.encoders.append(enc)
            names.add(enc.name)
            if score is not None and enc.name not in out.reference.scores:
                out.reference.scores[enc.name] = float(score)
    return out


def new_encoders(cfg: BenchmarkConfig, seen: set[str]) -> list[str]:
    """Names of scanned encoders not in ``seen`` (the schedule's memory of past scans)."""
    return [e.name for e in with_scanned_checkpoints(cfg).encoders if e.name not in seen]

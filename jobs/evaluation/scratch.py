"""Where a cell keeps its resumable training state until its record is written.

Under the store when it is a local (or mounted) folder, else under ``extract.scratch_dir``
or ``$REPEVAL_HOME/scratch``; one folder per (kind, run id), one subfolder per part of
the run (a grid point, the refit). A run's id is its cell id, so the same work resumes
whichever run asks. It is deleted once the record is written.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from jobs.config.run import ExtractConfig, repeval_home
from storage_schema import keys, record_keys
from storage_schema.provenance import stable_hash

__all__ = ["remove_scratch", "scratch_folder"]


def scratch_folder(store: Any, extract: ExtractConfig, kind: str, run_id: str, part: str | None = None) -> Path:
    """Where a run keeps its resumable state (see the module doc).

    Parameters
    ----------
    store : the FeatureStore the record goes to.
    extract : the config's ``extract`` section (its ``scratch_dir``).
    kind : what runs (the protocol, e.g. ``finetune``; ``dense``).
    run_id : the run's content id (its cell id: the same work resumes whichever run asks).
    part : one unit of the run (``select-003``, ``refit``), or None for the whole run.

    Returns
    -------
    pathlib.Path
    """
    key = record_keys.scratch_key(kind, run_id, part)
    if extract.scratch_dir:
        return Path(extract.scratch_dir) / key.removeprefix(keys.SCRATCH + "/")
    if store.backend.local:
        return Path(store.backend.path(key))
    return repeval_home() / "scratch" / stable_hash(store.url, 16) / key.removeprefix(keys.SCRATCH + "/")


def remove_scratch(store: Any, extract: ExtractConfig, kind: str, run_id: str) -> None:
    """Delete a recorded run's scratch folder (its states are no longer needed).

    Parameters
    ----------
    store, extract, kind, run_id : as for :func:`scratch_folder`.
    """
    shutil.rmtree(scratch_folder(store, extract, kind, run_id), ignore_errors=True)

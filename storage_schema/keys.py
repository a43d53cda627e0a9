"""Key layout of the store: every key repeval reads or writes is built here."""

from __future__ import annotations

from pipeline.names import validate_name

SIDE = "_repeval"  # bookkeeping prefix inside the store root; never a zarr node
FEATURES = "features"
DATASETS = "datasets"
EVIDENCE = "evidence"
EARLY = "early"
LABELS = "labels"
TARGETS = "targets"  # prefix of a dense split's target arrays: targets-<geometry>
LEDGER = f"{SIDE}/ledger"
ZARR_METADATA = "zarr.json"  # a Zarr v3 node's metadata document
_STATE = f"{SIDE}/state"
_LEASES = f"{SIDE}/leases"
_ALIASES = f"{SIDE}/aliases"
_FINGERPRINTS = f"{SIDE}/fingerprints"
SCRATCH = f"{SIDE}/scratch"


# -- zarr nodes ------------------------------------------------------------------------------
def features_group_key(model: str, dataset: str, split: str) -> str:
    """The group holding every layer of one encoder on one split; the unit of a lease.

    Parameters
    ----------
    model, dataset, split : str
        Names of the encoder, the dataset and the split (validated).

    Returns
    -------
    str
        ``features/<model>/<dataset>/<split>``.
    """
    return "/".join(
        (FEATURES, validate_name(model, "model name"), validate_name(dataset, "dataset name"),
         validate_name(split, "split name"))
    )


def feature_key(model: str, dataset: str, split: str, layer: str) -> str:
    """The array of one layer of one encoder on one split.

    Parameters
    ----------
    model, dataset, split, layer : str
        Names of the encoder, the dataset, the split and the layer (validated).

    Returns
    -------
    str
        ``features/<model>/<dataset>/<split>/<layer>``.
    """
    return f"{features_group_key(model, dataset, split)}/{validate_name(layer, 'layer name')}"


def early_group_key(model: str, dataset: str, subset: str, split: str) -> str:
    """The group holding every layer of one encoder on the early rows of one split; the unit
    of a lease."""
    return "/".join((EARLY, validate_name(model, "model name"), validate_name(dataset, "dataset name"),
                     validate_name(subset, "subset id"), validate_name(split, "split name")))


def early_feature_key(model: str, dataset: str, subset: str, split: str, layer: str) -> str:
    """One layer of one encoder on the early rows of one split (a subset's rows, in order)."""
    return f"{early_group_key(model, dataset, subset, split)}/{validate_name(layer, 'layer name')}"


def labels_group_key(dataset: str, split: str) -> str:
    """The group holding a split's labels; the unit of the labels' lease."""
    return "/".join((DATASETS, validate_name(dataset, "dataset name"), validate_name(split, "split name")))


def labels_key(dataset: str, split: str) -> str:
    """The labels array of one split.

    Parameters
    ----------
    dataset, split : str
        Names of the dataset and the split (validated).

    Returns
    -------
    str
        ``datasets/<dataset>/<split>/labels``.
    """
    return f"{labels_group_key(dataset, split)}/{LABELS}"


def targets_key(dataset: str, split: str, geometry: str) -> str:
    """The per-pixel targets of one split of a dense dataset, laid over one input geometry."""
    return f"{labels_group_key(dataset, split)}/{validate_name(f'{TARGETS}-{geometry}', 'targets name')}"


def group_of(key: str) -> str:
    """The group (lease unit) an array key belongs to: the key without its last part."""
    return key.rsplit("/", 1)[0]


def parse_feature_key(key: str) -> tuple[str, str, str, str]:
    """Split a feature key into its names.

    Parameters
    ----------
    key : str
        A key built by :func:`feature_key`.

    Returns
    -------
    tuple of str
        ``(model, dataset, split, layer)``; ValueError when ``key`` is not a feature key.
    """
    parts = key.strip("/").split("/")
    if len(parts) != 5 or parts[0] != FEATURES:
        raise ValueError(f"{key!r} is not a feature key: expected features/<model>/<dataset>/<split>/<layer>")
    return parts[1], parts[2], parts[3], parts[4]


def evidence_group_key(cell_id: str) -> str:
    """The group holding one cell's evidence arrays; the unit of their lease."""
    validate_name(cell_id, "cell id")
    return f"{EVIDENCE}/{cell_id[:2]}/{cell_id}"


def evidence_key(cell_id: str, name: str) -> str:
    """One evidence array of one cell (e.g. ``predictions``, ``episodes``)."""
    return f"{evidence_group_key(cell_id)}/{validate_name(name, 'evidence name')}"


def evidence_prefix(*names: str) -> str:
    """The folder of the evidence keys under the given leading names, for listing."""
    return "/".join((EVIDENCE, *names))


def features_prefix(*names: str) -> str:
    """The folder of the feature keys under the given leading names, for listing."""
    return "/".join((FEATURES, *names))


def datasets_prefix(*names: str) -> str:
    """The folder of the labels keys under the given leading names, for listing."""
    return "/".join((DATASETS, *names))


def node_metadata_key(key: str) -> str:
    """The Zarr v3 metadata document of the node at ``key``; it exists once the node does."""
    return f"{key}/{ZARR_METADATA}"


def chunk_data_key(key: str, encoded_chunk: str) -> str:
    """The stored bytes of one chunk of the Zarr array at ``key``."""
    return f"{key}/{encoded_chunk}"


# -- completion bookkeeping ------------------------------------------------------------------
def state_key(key: str, fingerprint: str | None = None) -> str:
    """Where an array's progress is recorded; per fingerprint when one is given."""
    # Markers are keyed by fingerprint, so a replaced array never inherits the old array's
    # progress.
    return f"{_STATE}/{key}" if fingerprint is None else f"{_STATE}/{key}/{fingerprint}"


def chunk_markers_key(key: str, fingerprint: str) -> str:
    """The folder of the chunk-done markers of an array."""
    return f"{state_key(key, fingerprint)}/chunks"


def chunk_marker_key(key: str, fingerprint: str, chunk: int) -> str:
    """The marker recording that chunk ``chunk`` of an array is written."""
    return f"{chunk_markers_key(key, fingerprint)}/{int(chunk)}"


def completion_key(key: str, fingerprint: str) -> str:
    """The record that makes an array complete (and readable)."""
    return f"{state_key(key, fingerprint)}/complete.json"


# -- leases ----------------------------------------------------------------------------------
def lease_dir(key: str) -> str:
    """The folder of the generation files of the lease on ``key``."""
    return f"{_LEASES}/{key}"


def lease_generation_key(key: str, generation: int) -> str:
    """One generation file of the lease on ``key``."""
    return f"{lease_dir(key)}/{int(generation)}.json"


# -- identical arrays ------------------------------------------------------------------------
def alias_key(key: str) -> str:
    """The record saying that the array ``key`` is stored under another key."""
    return f"{_ALIASES}/{key}.json"


def aliases_dir(prefix: str) -> str:
    """The folder of the alias records of the array keys under ``prefix``, for listing."""
    return f"{_ALIASES}/{prefix}"


def fingerprint_index_key(fingerprint: str) -> str:
    """The record naming the complete array that holds ``fingerprint``."""
    return f"{_FINGERPRINTS}/{validate_name(fingerprint, 'fingerprint')}.json"

"""Key layout of the store: every key repeval reads or writes is built here.

Zarr nodes (read by any Zarr client):

* ``datasets/<dataset>/<split>/labels``: the labels of a split;
* ``datasets/<dataset>/<split>/targets-<geometry>``: the per-pixel targets of a dense
  dataset's split, laid over one input geometry (resize and crop);
* ``features/<model>/<dataset>/<split>/<layer>``: one layer of one encoder on one split;
* ``evidence/<cell id[:2]>/<cell id>/<name>``: what an evaluated cell keeps for paired
  comparisons (test predictions, multi-label scores, per-episode accuracies, per-image
  pixel counts) and a dense cell's predicted test maps;
* ``early/<model>/<dataset>/<subset>/<split>/<layer>``: one layer of one encoder on the
  early rows of a split (the rows of one chosen subset, in their order; ``docs/early.md``).

Bookkeeping beside them, under ``_repeval/`` (never a Zarr node):

* ``state/<array key>/<fingerprint>/chunks/<i>``: chunk ``i`` is written;
* ``state/<array key>/<fingerprint>/complete.json``: the array is complete;
* ``leases/<group key>/<generation>.json``: the write lease of an array group;
* ``aliases/<array key>.json``: an array stored under another key (identical weights);
* ``fingerprints/<fingerprint>.json``: the complete array holding a fingerprint;
Where the runs' records go (the ledger, failures, identity pointers, schedules' state,
plans, scratch): :mod:`storage_schema.record_keys`.

Names that become key components are validated, so no key can leave its folder.

The module is longer than 450 lines because it is the one place the arrays' keys are built:
some twenty-five functions of a few lines each, most of each its numpydoc.
"""

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
    of a lease.

    Parameters
    ----------
    model, dataset : str
        Names of the encoder and the dataset (validated).
    subset : str
        The early subset's id (hexadecimal, validated).
    split : str
        The split's name (validated).

    Returns
    -------
    str
        ``early/<model>/<dataset>/<subset>/<split>``.
    """
    return "/".join((EARLY, validate_name(model, "model name"), validate_name(dataset, "dataset name"),
                     validate_name(subset, "subset id"), validate_name(split, "split name")))


def early_feature_key(model: str, dataset: str, subset: str, split: str, layer: str) -> str:
    """One layer of one encoder on the early rows of one split (a subset's rows, in order).

    Parameters
    ----------
    model, dataset, subset, split, layer : str
        Names of the encoder, the dataset, the subset's id, the split and the layer (validated).

    Returns
    -------
    str
        ``early/<model>/<dataset>/<subset>/<split>/<layer>``.
    """
    return f"{early_group_key(model, dataset, subset, split)}/{validate_name(layer, 'layer name')}"


def labels_group_key(dataset: str, split: str) -> str:
    """The group holding a split's labels; the unit of the labels' lease.

    Parameters
    ----------
    dataset, split : str
        Names of the dataset and the split (validated).

    Returns
    -------
    str
        ``datasets/<dataset>/<split>``.
    """
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
    """The per-pixel targets of one split of a dense dataset, laid over one input geometry.

    Parameters
    ----------
    dataset, split : str
        Names of the dataset and the split (validated).
    geometry : str
        The geometry's tag (``r73-c64x64``; validated).

    Returns
    -------
    str
        ``datasets/<dataset>/<split>/targets-<geometry>``.
    """
    return f"{labels_group_key(dataset, split)}/{validate_name(f'{TARGETS}-{geometry}', 'targets name')}"


def group_of(key: str) -> str:
    """The group (lease unit) an array key belongs to: the key without its last part.

    Parameters
    ----------
    key : str
        A feature or labels key.

    Returns
    -------
    str
        The parent group's key.
    """
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
    """The group holding one cell's evidence arrays; the unit of their lease.

    Parameters
    ----------
    cell_id : str
        The cell's id (hexadecimal, validated).

    Returns
    -------
    str
        ``evidence/<cell_id[:2]>/<cell_id>``.
    """
    validate_name(cell_id, "cell id")
    return f"{EVIDENCE}/{cell_id[:2]}/{cell_id}"


def evidence_key(cell_id: str, name: str) -> str:
    """One evidence array of one cell (e.g. ``predictions``, ``episodes``).

    Parameters
    ----------
    cell_id : str
        The cell's id (validated).
    name : str
        The array's name (validated).

    Returns
    -------
    str
        ``evidence/<cell_id[:2]>/<cell_id>/<name>``.
    """
    return f"{evidence_group_key(cell_id)}/{validate_name(name, 'evidence name')}"


def evidence_prefix(*names: str) -> str:
    """The folder of the evidence keys under the given leading names, for listing.

    Parameters
    ----------
    *names : str
        Up to three leading names (shard, cell id, array name) as read from a listing.

    Returns
    -------
    str
        ``evidence`` followed by ``names``.
    """
    return "/".join((EVIDENCE, *names))


def features_prefix(*names: str) -> str:
    """The folder of the feature keys under the given leading names, for listing.

    Parameters
    ----------
    *names : str
        Up to four leading names (model, dataset, split, layer) as read from a listing.

    Returns
    -------
    str
        ``features`` followed by ``names``.
    """
    return "/".join((FEATURES, *names))


def datasets_prefix(*names: str) -> str:
    """The folder of the labels keys under the given leading names, for listing.

    Parameters
    ----------
    *names : str
        Up to two leading names (dataset, split) as read from a listing.

    Returns
    -------
    str
        ``datasets`` followed by ``names``.
    """
    return "/".join((DATASETS, *names))


def node_metadata_key(key: str) -> str:
    """The Zarr v3 metadata document of the node at ``key``; it exists once the node does.

    Parameters
    ----------
    key : str
        A Zarr node's key.

    Returns
    -------
    str
        ``<key>/zarr.json``.
    """
    return f"{key}/{ZARR_METADATA}"


def chunk_data_key(key: str, encoded_chunk: str) -> str:
    """The stored bytes of one chunk of the Zarr array at ``key``.

    Parameters
    ----------
    key : str
        The array's key.
    encoded_chunk : str
        The chunk's key as the array's chunk key encoding writes it (``c/1/0``).

    Returns
    -------
    str
        ``<key>/<encoded_chunk>``.
    """
    return f"{key}/{encoded_chunk}"


# -- completion bookkeeping ------------------------------------------------------------------
def state_key(key: str, fingerprint: str | None = None) -> str:
    """Where an array's progress is recorded; per fingerprint when one is given.

    Markers are keyed by fingerprint, so a replaced array never inherits the old array's
    progress.

    Parameters
    ----------
    key : str
        The array's key.
    fingerprint : str, optional
        The array's fingerprint; without it, the folder of every fingerprint's state.

    Returns
    -------
    str
        ``_repeval/state/<key>[/<fingerprint>]``.
    """
    return f"{_STATE}/{key}" if fingerprint is None else f"{_STATE}/{key}/{fingerprint}"


def chunk_markers_key(key: str, fingerprint: str) -> str:
    """The folder of the chunk-done markers of an array.

    Parameters
    ----------
    key, fingerprint : str
        The array's key and fingerprint.

    Returns
    -------
    str
        ``_repeval/state/<key>/<fingerprint>/chunks``.
    """
    return f"{state_key(key, fingerprint)}/chunks"


def chunk_marker_key(key: str, fingerprint: str, chunk: int) -> str:
    """The marker recording that chunk ``chunk`` of an array is written.

    Parameters
    ----------
    key, fingerprint : str
        The array's key and fingerprint.
    chunk : int
        The chunk's index along the rows.

    Returns
    -------
    str
        ``_repeval/state/<key>/<fingerprint>/chunks/<chunk>``.
    """
    return f"{chunk_markers_key(key, fingerprint)}/{int(chunk)}"


def completion_key(key: str, fingerprint: str) -> str:
    """The record that makes an array complete (and readable).

    Parameters
    ----------
    key, fingerprint : str
        The array's key and fingerprint.

    Returns
    -------
    str
        ``_repeval/state/<key>/<fingerprint>/complete.json``.
    """
    return f"{state_key(key, fingerprint)}/complete.json"


# -- leases ----------------------------------------------------------------------------------
def lease_dir(key: str) -> str:
    """The folder of the generation files of the lease on ``key``.

    Parameters
    ----------
    key : str
        The leased key (an array group).

    Returns
    -------
    str
        ``_repeval/leases/<key>``.
    """
    return f"{_LEASES}/{key}"


def lease_generation_key(key: str, generation: int) -> str:
    """One generation file of the lease on ``key``.

    Parameters
    ----------
    key : str
        The leased key.
    generation : int
        The generation number.

    Returns
    -------
    str
        ``_repeval/leases/<key>/<generation>.json``.
    """
    return f"{lease_dir(key)}/{int(generation)}.json"


# -- identical arrays ------------------------------------------------------------------------
def alias_key(key: str) -> str:
    """The record saying that the array ``key`` is stored under another key.

    Parameters
    ----------
    key : str
        The array key a reader asks for.

    Returns
    -------
    str
        ``_repeval/aliases/<key>.json``.
    """
    return f"{_ALIASES}/{key}.json"


def aliases_dir(prefix: str) -> str:
    """The folder of the alias records of the array keys under ``prefix``, for listing.

    Parameters
    ----------
    prefix : str
        A folder of array keys (e.g. from :func:`features_prefix`).

    Returns
    -------
    str
        ``_repeval/aliases/<prefix>``.
    """
    return f"{_ALIASES}/{prefix}"


def fingerprint_index_key(fingerprint: str) -> str:
    """The record naming the complete array that holds ``fingerprint``.

    Parameters
    ----------
    fingerprint : str
        An array fingerprint (hexadecimal).

    Returns
    -------
    str
        ``_repeval/fingerprints/<fingerprint>.json``.
    """
    return f"{_FINGERPRINTS}/{validate_name(fingerprint, 'fingerprint')}.json"

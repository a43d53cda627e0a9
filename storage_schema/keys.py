"""Key layout of the store: every key repeval reads or writes is built here.

Longer than 450 lines because every key of the store is built in this one module, so the
layout can be read (and changed) in one place.

Zarr nodes (read by any Zarr client):

* ``datasets/<dataset>/<split>/labels``: the labels of a split;
* ``datasets/<dataset>/<split>/targets-<geometry>``: the per-pixel targets of a dense
  dataset's split, laid over one input geometry (resize and crop);
* ``features/<model>/<dataset>/<split>/<layer>``: one layer of one encoder on one split;
* ``evidence/<cell id[:2]>/<cell id>/<name>``: what an evaluated cell keeps for paired
  comparisons (test predictions, multi-label scores, per-episode accuracies, per-image
  pixel counts) and a dense cell's predicted test maps.

Bookkeeping beside them, under ``_repeval/`` (never a Zarr node):

* ``state/<array key>/<fingerprint>/chunks/<i>``: chunk ``i`` is written;
* ``state/<array key>/<fingerprint>/complete.json``: the array is complete;
* ``leases/<group key>/<generation>.json``: the write lease of an array group;
* ``aliases/<array key>.json``: an array stored under another key (identical weights);
* ``fingerprints/<fingerprint>.json``: the complete array holding a fingerprint;
* ``ledger/<cell id[:2]>/<cell id>.json``: one evaluated cell;
* ``failures/<kind>/<id>.json``: one failed unit of work;
* ``encoder_cells/<model>/<dataset>/<setting>.json``: the ledger record an encoder-protocol
  cell of these names last used (found without loading the encoder);
* ``identity_cells/<identity>/<dataset>/<layer>/<setting>.json``: the ledger record the
  cell of one encoder identity last used (two configs sharing an encoder name);
* ``owners/<array key>/<identity>.json``: the fingerprint one config identity extracted
  (or found up to date) at that key: whose weights and data the name's array holds;
* ``checkpoint_facts/facts.json``: what scans read from checkpoint files (steps, content
  fingerprints), by real path, size and modification time;
* ``leases/cells/<cell id[:2]>/<cell id>/``: the lease of a cell being computed;
* ``examples/<cell id[:2]>/<cell id>.png``: example pictures of an encoder-protocol cell;
* ``scratch/<kind>/<run id>/<part>/``: resumable training state, deleted once recorded;
* ``watch/<hash of a config path>.json``: what a schedule saw last;
* ``runs/<hash of a planned config>.json``: what the last run of it without failures
  covered (a rerun with nothing to do is answered from it);
* ``plans/<hash of the plan>.json``: a run's plan (its config, units and cells), written
  once before the run and read by its flow and report.

Names that become key components are validated, so no key can leave its folder.
This module is longer than 450 lines because every key is built here, each with its
docstring: one place shows the whole layout.
"""

from __future__ import annotations

from pipeline.names import validate_name
from storage_schema.provenance import stable_hash

SIDE = "_repeval"  # bookkeeping prefix inside the store root; never a zarr node
FEATURES = "features"
DATASETS = "datasets"
EVIDENCE = "evidence"
LABELS = "labels"
TARGETS = "targets"  # prefix of a dense split's target arrays: targets-<geometry>
LEDGER = f"{SIDE}/ledger"
ZARR_METADATA = "zarr.json"  # a Zarr v3 node's metadata document
_STATE = f"{SIDE}/state"
_LEASES = f"{SIDE}/leases"
_ALIASES = f"{SIDE}/aliases"
_FINGERPRINTS = f"{SIDE}/fingerprints"
_FAILURES = f"{SIDE}/failures"
_WATCH = f"{SIDE}/watch"
_RUNS = f"{SIDE}/runs"
_PLANS = f"{SIDE}/plans"
_ENCODER_CELLS = f"{SIDE}/encoder_cells"
_IDENTITY_CELLS = f"{SIDE}/identity_cells"
_OWNERS = f"{SIDE}/owners"
_CHECKPOINT_FACTS = f"{SIDE}/checkpoint_facts"
_EXAMPLES = f"{SIDE}/examples"
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


# -- results and schedules -------------------------------------------------------------------
def ledger_record_key(cell_id: str) -> str:
    """The ledger record of one cell, sharded by the id's first two characters.

    Parameters
    ----------
    cell_id : str
        The cell's id (hexadecimal).

    Returns
    -------
    str
        ``_repeval/ledger/<cell_id[:2]>/<cell_id>.json``.
    """
    validate_name(cell_id, "cell id")
    return f"{ledger_shard_key(cell_id[:2])}/{cell_id}.json"


def ledger_shard_key(shard: str) -> str:
    """One shard folder of the ledger, for listing.

    Parameters
    ----------
    shard : str
        A shard's name (two characters of a cell id), as read from a listing.

    Returns
    -------
    str
        ``_repeval/ledger/<shard>``.
    """
    return f"{LEDGER}/{shard}"


def encoder_cell_key(model: str, dataset: str, setting: str) -> str:
    """Which ledger record the encoder-protocol cell of these names last used.

    Parameters
    ----------
    model, dataset, setting : str
        Names of the encoder, the dataset and the protocol setting (validated).

    Returns
    -------
    str
        ``_repeval/encoder_cells/<model>/<dataset>/<setting>.json``.
    """
    return "/".join((_ENCODER_CELLS, validate_name(model, "model name"), validate_name(dataset, "dataset name"),
                     validate_name(setting, "protocol setting name") + ".json"))


def identity_cell_key(identity: str, dataset: str, layer: str, setting: str) -> str:
    """Which ledger record the cell of one encoder identity (a hash of the config fields
    that decide its weights and input, ``jobs.encoder_identity``) last used: found again
    when the name's arrays now hold another config's weights.

    Parameters
    ----------
    identity : str
        The encoder identity (hexadecimal, validated).
    dataset, layer, setting : str
        Names of the dataset, the layer and the protocol setting (validated).

    Returns
    -------
    str
        ``_repeval/identity_cells/<identity>/<dataset>/<layer>/<setting>.json``.
    """
    return "/".join((_IDENTITY_CELLS, validate_name(identity, "encoder identity"),
                     validate_name(dataset, "dataset name"), validate_name(layer, "layer name"),
                     validate_name(setting, "protocol setting name") + ".json"))


def array_owners_dir(key: str) -> str:
    """The folder of the notes saying which config identities extracted (or found up to
    date) the array at ``key``, and at which fingerprint.

    Parameters
    ----------
    key : str
        A feature key (built by :func:`feature_key`).

    Returns
    -------
    str
        ``_repeval/owners/<key>``.
    """
    return f"{_OWNERS}/{key}"


def array_owner_key(key: str, identity: str) -> str:
    """The note of one config identity on the array at ``key`` (its fingerprint).

    Parameters
    ----------
    key : str
        A feature key.
    identity : str
        The identity (hexadecimal, validated).

    Returns
    -------
    str
        ``_repeval/owners/<key>/<identity>.json``.
    """
    return f"{array_owners_dir(key)}/{validate_name(identity, 'identity')}.json"


def checkpoint_facts_key() -> str:
    """What scans read from checkpoint files (steps, content fingerprints), by real path,
    size and modification time: an unchanged folder is scanned again without reading them.

    Returns
    -------
    str
        ``_repeval/checkpoint_facts/facts.json``.
    """
    return f"{_CHECKPOINT_FACTS}/facts.json"


def cell_work_key(cell_id: str) -> str:
    """The group leased while one cell is computed: two runs at once compute it once.

    Parameters
    ----------
    cell_id : str
        The cell's id (hexadecimal, validated).

    Returns
    -------
    str
        ``cells/<cell_id[:2]>/<cell_id>`` (a lease key, never a Zarr node).
    """
    validate_name(cell_id, "cell id")
    return f"cells/{cell_id[:2]}/{cell_id}"


def examples_key(cell_id: str) -> str:
    """The PNG of example pictures (saliency maps, reconstructions) of one cell.

    Parameters
    ----------
    cell_id : str
        The cell's id (hexadecimal).

    Returns
    -------
    str
        ``_repeval/examples/<cell_id[:2]>/<cell_id>.png``.
    """
    validate_name(cell_id, "cell id")
    return f"{_EXAMPLES}/{cell_id[:2]}/{cell_id}.png"


def scratch_key(kind: str, run_id: str, part: str | None = None) -> str:
    """The folder of one run's resumable state (or of one part of it).

    Parameters
    ----------
    kind : str
        What the run is (e.g. ``finetune``; validated).
    run_id : str
        The run's content id (e.g. its cell id; validated).
    part : str, optional
        One unit of the run (e.g. ``select-003``, ``refit``; validated).

    Returns
    -------
    str
        ``_repeval/scratch/<kind>/<run_id>`` or ``.../<run_id>/<part>``.
    """
    key = f"{SCRATCH}/{validate_name(kind, 'scratch kind')}/{validate_name(run_id, 'run id')}"
    return key if part is None else f"{key}/{validate_name(part, 'scratch part')}"


def failures_dir(kind: str) -> str:
    """The folder of the failure records of one kind of work, for listing.

    Parameters
    ----------
    kind : str
        The kind of work (e.g. ``cell``, ``extraction``, ``correlation``; validated).

    Returns
    -------
    str
        ``_repeval/failures/<kind>``.
    """
    return f"{_FAILURES}/{validate_name(kind, 'failure kind')}"


def failure_key(kind: str, id: str) -> str:
    """The record of one failed unit of work.

    Parameters
    ----------
    kind : str
        The kind of work (validated).
    id : str
        The unit's id (validated as one key component: use a hash for composite ids).

    Returns
    -------
    str
        ``_repeval/failures/<kind>/<id>.json``.
    """
    return f"{failures_dir(kind)}/{validate_name(id, 'failure id')}.json"


def watch_key(config_path: str) -> str:
    """The state a schedule keeps for one config file.

    Parameters
    ----------
    config_path : str
        The config file's path, as the schedule names it.

    Returns
    -------
    str
        ``_repeval/watch/<16 hex digits of the path's hash>.json``.
    """
    return f"{_WATCH}/{stable_hash(str(config_path), 16)}.json"


def run_memo_key(config_hash: str) -> str:
    """What the last run without failures of one planned config covered (``jobs.rerun``).

    Parameters
    ----------
    config_hash : str
        The hash of the planned config (its scanned checkpoints included).

    Returns
    -------
    str
        ``_repeval/runs/<config_hash>.json``.
    """
    return f"{_RUNS}/{validate_name(config_hash, 'config hash')}.json"


def plan_key(plan_hash: str) -> str:
    """A run's plan, keyed by its contents' hash (``jobs.plan_store``).

    Parameters
    ----------
    plan_hash : str
        The hash of the plan's contents.

    Returns
    -------
    str
        ``_repeval/plans/<plan_hash>.json``.
    """
    return f"{_PLANS}/{validate_name(plan_hash, 'plan hash')}.json"

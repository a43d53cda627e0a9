"""Key layout of what runs record beside the arrays, under ``_repeval/`` (never a Zarr
node); the arrays' own keys and their bookkeeping are :mod:`storage_schema.keys`.

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
  once before the run and read by its flow and report;
* ``early/<kind>/...``: the early pass's records, never mixed with the ledger
  (``storage_schema.early``): ``subsets/<dataset>/<id>.json`` (the rows it reads),
  ``results/<id[:2]>/<id>.json`` (a readout fitted on them), ``estimates/<id[:2]>/<id>.json``
  (an early estimate and its verdicts), ``checks/<id[:2]>/<id>.json`` (an estimate against
  the exact figure that followed).

Names that become key components are validated, so no key can leave its folder.
"""

from __future__ import annotations

from pipeline.names import validate_name
from storage_schema.keys import LEDGER, SCRATCH, SIDE
from storage_schema.provenance import stable_hash

_FAILURES = f"{SIDE}/failures"
_WATCH = f"{SIDE}/watch"
_RUNS = f"{SIDE}/runs"
_PLANS = f"{SIDE}/plans"
_ENCODER_CELLS = f"{SIDE}/encoder_cells"
_IDENTITY_CELLS = f"{SIDE}/identity_cells"
_OWNERS = f"{SIDE}/owners"
_CHECKPOINT_FACTS = f"{SIDE}/checkpoint_facts"
_EXAMPLES = f"{SIDE}/examples"
_EARLY = f"{SIDE}/early"
#: What the early pass records (each kind a folder of its own under ``_repeval/early``).
EARLY_KINDS = ("subsets", "results", "estimates", "checks")


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


def grid_point_work_key(cell_id: str, index: int) -> str:
    """The group leased while one grid point of a cell trains (fine-tuning): two runs at once
    train it once, the second resuming from the first's saved final state.

    Parameters
    ----------
    cell_id : str
        The cell's id (hexadecimal, validated).
    index : int
        The point's position in its grid.

    Returns
    -------
    str
        ``cells/<cell_id[:2]>/<cell_id>-point<index>`` (a lease key, never a Zarr node).
    """
    validate_name(cell_id, "cell id")
    return f"cells/{cell_id[:2]}/{cell_id}-point{int(index):03d}"


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


def early_dir(kind: str, shard: str | None = None) -> str:
    """The folder of one kind of early-pass record (or of one shard or dataset of it), for listing.

    Parameters
    ----------
    kind : str
        One of ``EARLY_KINDS``.
    shard : str, optional
        A shard (two characters of an id) or, for ``subsets``, a dataset's name (validated).

    Returns
    -------
    str
        ``_repeval/early/<kind>`` or ``_repeval/early/<kind>/<shard>``.
    """
    if kind not in EARLY_KINDS:
        raise ValueError(f"early record kind {kind!r} is not one of {', '.join(EARLY_KINDS)}")
    return f"{_EARLY}/{kind}" if shard is None else f"{_EARLY}/{kind}/{validate_name(shard, 'early shard')}"


def early_record_key(kind: str, id: str, dataset: str | None = None) -> str:
    """One early-pass record: a subset (under its dataset), or a result, estimate or check
    (sharded by the id's first two characters).

    Parameters
    ----------
    kind : str
        One of ``EARLY_KINDS``.
    id : str
        The record's id (hexadecimal, validated).
    dataset : str, optional
        The dataset's name, for a subset.

    Returns
    -------
    str
        ``_repeval/early/subsets/<dataset>/<id>.json`` or ``_repeval/early/<kind>/<id[:2]>/<id>.json``.
    """
    validate_name(id, "early record id")
    if kind == "subsets":
        if dataset is None:
            raise ValueError("a subset's key needs its dataset")
        return f"{early_dir(kind, dataset)}/{id}.json"
    return f"{early_dir(kind, id[:2])}/{id}.json"

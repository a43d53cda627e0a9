"""Key layout of what runs record beside the arrays, under ``_repeval/`` (never a Zarr
node); the arrays' own keys and their bookkeeping are :mod:`storage_schema.keys`."""

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
    """The ledger record of one cell, sharded by the id's first two characters."""
    validate_name(cell_id, "cell id")
    return f"{ledger_shard_key(cell_id[:2])}/{cell_id}.json"


def ledger_shard_key(shard: str) -> str:
    """One shard folder of the ledger, for listing."""
    return f"{LEDGER}/{shard}"


def encoder_cell_key(model: str, dataset: str, setting: str) -> str:
    """Which ledger record the encoder-protocol cell of these names last used."""
    return "/".join((_ENCODER_CELLS, validate_name(model, "model name"), validate_name(dataset, "dataset name"),
                     validate_name(setting, "protocol setting name") + ".json"))


def identity_cell_key(identity: str, dataset: str, layer: str, setting: str) -> str:
    """Which ledger record the cell of one encoder identity (a hash of the config fields
    that decide its weights and input, ``jobs.evaluation.encoder_identity``) last used: found again
    when the name's arrays now hold another config's weights."""
    return "/".join((_IDENTITY_CELLS, validate_name(identity, "encoder identity"),
                     validate_name(dataset, "dataset name"), validate_name(layer, "layer name"),
                     validate_name(setting, "protocol setting name") + ".json"))


def array_owners_dir(key: str) -> str:
    """The folder of the notes saying which config identities extracted (or found up to
    date) the array at ``key``, and at which fingerprint."""
    return f"{_OWNERS}/{key}"


def array_owner_key(key: str, identity: str) -> str:
    """The note of one config identity on the array at ``key`` (its fingerprint)."""
    return f"{array_owners_dir(key)}/{validate_name(identity, 'identity')}.json"


def checkpoint_facts_key() -> str:
    """What scans read from checkpoint files (steps, content fingerprints), by real path,
    size and modification time: an unchanged folder is scanned again without reading them."""
    return f"{_CHECKPOINT_FACTS}/facts.json"


def cell_work_key(cell_id: str) -> str:
    """The group leased while one cell is computed: two runs at once compute it once."""
    validate_name(cell_id, "cell id")
    return f"cells/{cell_id[:2]}/{cell_id}"


def grid_point_work_key(cell_id: str, index: int) -> str:
    """The group leased while one grid point of a cell trains (fine-tuning): two runs at once
    train it once, the second resuming from the first's saved final state."""
    validate_name(cell_id, "cell id")
    return f"cells/{cell_id[:2]}/{cell_id}-point{int(index):03d}"


def examples_key(cell_id: str) -> str:
    """The PNG of example pictures (saliency maps, reconstructions) of one cell."""
    validate_name(cell_id, "cell id")
    return f"{_EXAMPLES}/{cell_id[:2]}/{cell_id}.png"


def scratch_key(kind: str, run_id: str, part: str | None = None) -> str:
    """The folder of one run's resumable state (or of one part of it)."""
    key = f"{SCRATCH}/{validate_name(kind, 'scratch kind')}/{validate_name(run_id, 'run id')}"
    return key if part is None else f"{key}/{validate_name(part, 'scratch part')}"


def failures_dir(kind: str) -> str:
    """The folder of the failure records of one kind of work, for listing."""
    return f"{_FAILURES}/{validate_name(kind, 'failure kind')}"


def failure_key(kind: str, id: str) -> str:
    """The record of one failed unit of work."""
    return f"{failures_dir(kind)}/{validate_name(id, 'failure id')}.json"


def watch_key(config_path: str) -> str:
    """The state a schedule keeps for one config file."""
    return f"{_WATCH}/{stable_hash(str(config_path), 16)}.json"


def run_memo_key(config_hash: str) -> str:
    """What the last run without failures of one planned config covered (``jobs.run.ledger_answer``)."""
    return f"{_RUNS}/{validate_name(config_hash, 'config hash')}.json"


def plan_key(plan_hash: str) -> str:
    """A run's plan, keyed by its contents' hash (``jobs.run.plan_store``)."""
    return f"{_PLANS}/{validate_name(plan_hash, 'plan hash')}.json"


def early_dir(kind: str, shard: str | None = None) -> str:
    """The folder of one kind of early-pass record (or of one shard or dataset of it), for listing."""
    if kind not in EARLY_KINDS:
        raise ValueError(f"early record kind {kind!r} is not one of {', '.join(EARLY_KINDS)}")
    return f"{_EARLY}/{kind}" if shard is None else f"{_EARLY}/{kind}/{validate_name(shard, 'early shard')}"


def early_record_key(kind: str, id: str, dataset: str | None = None) -> str:
    """One early-pass record: a subset (under its dataset), or a result, estimate or check
    (sharded by the id's first two characters)."""
    validate_name(id, "early record id")
    if kind == "subsets":
        if dataset is None:
            raise ValueError("a subset's key needs its dataset")
        return f"{early_dir(kind, dataset)}/{id}.json"
    return f"{early_dir(kind, id[:2])}/{id}.json"

"""What the schedules remember between runs, kept in the store beside the ledger.

A watch key names one config file. Its state records the hash of the config's protocol
settings and the encoders a run completed (with their checkpoint file's size and
modification time), so a schedule can tell "new checkpoints" and "protocol settings
changed" apart from "nothing to do" without running anything. Only what a run actually
planned and extracted is recorded: a file that arrived during the run, or failed, stays new.
Before any scheduled run is recorded (serve's first scan, after a ``repeval run`` of the
config), the ledger is asked instead: an encoder it holds cells of is not new.

The schedules evaluate one at a time per store: each holds the store's
:data:`SCHEDULE_LEASE` while it looks for changes and runs (a lease, so a killed run's
hold ends with it).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from jobs.config.checkpoint_folders import scan_checkpoints
from jobs.config import BenchmarkConfig
from jobs.evaluation.identity import recorded_cells
from jobs.plan import make_plan
from pipeline.errors import RepevalError
from storage_schema import FeatureStore
from storage_schema.record_keys import watch_key
from storage_schema.ledger import FailureLog
from storage_schema.provenance import now_iso

SCHEDULE_LEASE = "schedules/evaluation"  # held by the scheduled run evaluating a store


@dataclass
class WatchState:
    """What the last completed run saw: its protocols' hash, its encoders and the scanned files' signatures."""

    protocol_hash: str = ""
    encoders: list[str] = field(default_factory=list)
    files: dict[str, list[int]] = field(default_factory=dict)  # scanned encoder -> [size, mtime_ns]
    updated: str = ""


@dataclass(frozen=True)
class Changes:
    """What changed since the runs recorded; ``recorded``: whether any run was (before the
    first, everything is new and the settings count as changed)."""

    new_encoders: list[str]
    protocols_changed: bool
    recorded: bool = True

    @property
    def any(self) -> bool:
        """Whether anything calls for a run (new encoders or changed protocol settings)."""
        return bool(self.new_encoders) or self.protocols_changed

    @property
    def settings_edited(self) -> bool:
        """The protocol settings differ from those a recorded run used (the watcher's cue)."""
        return self.recorded and self.protocols_changed


def load_state(store: FeatureStore, key: str) -> WatchState | None:
    """The state the last completed run left at ``key``, or None before the first."""
    raw = store.backend.read(key)
    if raw is None:
        return None
    data = json.loads(raw)
    return WatchState(**{k: v for k, v in data.items() if k in WatchState.__dataclass_fields__})


def detect_changes(store: FeatureStore, cfg: BenchmarkConfig, key: str) -> Changes:
    """Compare the config (its checkpoint folders scanned now: ready files, not those that
    failed unchanged) with what the last runs completed."""
    state = load_state(store, key)
    failed = {r.get("file"): r for r in FailureLog(store).records("checkpoint")}
    scan = scan_checkpoints(cfg, failed)
    names = [e.name for e in cfg.encoders] + [f.encoder.name for f in scan.taken]
    if state is None:  # the settings count as changed (a run decides); new: what the ledger lacks
        held = evaluated_encoders(store, cfg)
        return Changes([n for n in names if n not in held], True, recorded=False)
    new = [n for n in names if n not in state.encoders]
    new += [f.encoder.name for f in scan.taken
            if f.encoder.name in state.encoders and state.files.get(f.encoder.name, f.signature) != f.signature]
    return Changes(new, state.protocol_hash != cfg.protocol_hash())


def evaluated_encoders(store: FeatureStore, cfg: BenchmarkConfig) -> set[str]:
    """The encoders of ``cfg`` (its folders scanned now) with at least one cell in the ledger
    at their current settings, told without torch (``jobs.evaluation.identity.recorded_cells``)."""
    try:
        plan = make_plan(cfg, record=False, store=store, check=False)
        found, _ = recorded_cells(store, plan.cells)
    except (RepevalError, OSError):  # no store yet, or a state the run's own checks explain
        return set()
    return {r["model"] for r in found}


def save_state(store: FeatureStore, cfg: BenchmarkConfig, key: str, completed: list[str] | None = None,
               files: dict[str, list[int]] | None = None) -> WatchState:
    """Record what a run covered: ``cfg`` is the config the run planned (scanned encoders
    included), ``completed`` the encoders whose extractions all succeeded (default: all of
    ``cfg``'s), ``files`` their checkpoint signatures. Earlier completions are kept."""
    old = load_state(store, key) or WatchState()
    done = [e.name for e in cfg.encoders] if completed is None else list(completed)
    encoders = list(dict.fromkeys([n for n in old.encoders] + done))
    kept_files = {**old.files, **{n: list(sig) for n, sig in (files or {}).items() if n in done}}
    state = WatchState(cfg.protocol_hash(), encoders, kept_files, now_iso())
    store.check_writable()
    store.backend.write_atomic(key, json.dumps(asdict(state)).encode())
    return state

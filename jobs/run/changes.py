"""What the schedules remember between runs, kept in the store beside the ledger."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from jobs.config import BenchmarkConfig
from jobs.evaluation.identity import recorded_cells
from jobs.run.plan import Plan
from pipeline.errors import RepevalError
from storage_schema import FeatureStore
from storage_schema.record_keys import watch_key  # noqa: F401  re-exported: the key a config file's state is kept at
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


def detect_changes(store: FeatureStore, listing: Plan, key: str) -> Changes:
    """Compare a run's listing of the config (its folders as scanned: ready files, not those
    that failed unchanged; ``jobs.run.plan.list_work``) with what the last runs completed."""
    state = load_state(store, key)
    names = [e.name for e in listing.config.encoders]
    if state is None:  # the settings count as changed (a run decides); new: what the ledger lacks
        held = evaluated_encoders(store, listing)
        return Changes([n for n in names if n not in held], True, recorded=False)
    new = [n for n in names if n not in state.encoders]
    new += [f.encoder.name for f in listing.scan.taken
            if f.encoder.name in state.encoders and state.files.get(f.encoder.name, f.signature) != f.signature]
    return Changes(new, state.protocol_hash != listing.config.protocol_hash())


def settings_edited(store: FeatureStore, cfg: BenchmarkConfig, key: str) -> bool:
    """Whether the protocol settings differ from those of the runs recorded (the watcher's
    cue, read without scanning any folder); False before any run is recorded."""
    state = load_state(store, key)
    return state is not None and state.protocol_hash != cfg.protocol_hash()


def evaluated_encoders(store: FeatureStore, listing: Plan) -> set[str]:
    """The encoders of a listing with at least one cell in the ledger at their current
    settings, told without torch (``jobs.evaluation.identity.recorded_cells``)."""
    try:
        found, _ = recorded_cells(store, listing.cells)
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

"""What the schedules remember between runs, kept in the store beside the ledger.

A watch key names one config file. Its state records the hash of the config's protocol
settings and the encoders seen, so a schedule can tell "new checkpoints" and "protocol
settings changed" apart from "nothing to do" without running anything.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from jobs.checkpoint_scan import with_scanned_checkpoints
from jobs.config import BenchmarkConfig
from storage_schema import FeatureStore
from storage_schema.keys import watch_key
from storage_schema.provenance import now_iso


@dataclass
class WatchState:
    protocol_hash: str = ""
    encoders: list[str] = field(default_factory=list)
    updated: str = ""


@dataclass(frozen=True)
class Changes:
    new_encoders: list[str]
    protocols_changed: bool

    @property
    def any(self) -> bool:
        return bool(self.new_encoders) or self.protocols_changed


def load_state(store: FeatureStore, key: str) -> WatchState | None:
    raw = store.backend.read(key)
    return WatchState(**json.loads(raw)) if raw is not None else None


def detect_changes(store: FeatureStore, cfg: BenchmarkConfig, key: str) -> Changes:
    """Compare the config (with its checkpoint folders scanned now) with the last run's state."""
    state = load_state(store, key)
    names = [e.name for e in with_scanned_checkpoints(cfg).encoders]
    if state is None:
        return Changes(names, True)
    return Changes([n for n in names if n not in state.encoders], state.protocol_hash != cfg.protocol_hash())


def save_state(store: FeatureStore, cfg: BenchmarkConfig, key: str) -> WatchState:
    """Record what a successful run covered (the owner of this watch key writes it)."""
    state = WatchState(cfg.protocol_hash(), [e.name for e in with_scanned_checkpoints(cfg).encoders], now_iso())
    store.check_writable()
    store.backend.write_atomic(key, json.dumps(asdict(state)).encode())
    return state

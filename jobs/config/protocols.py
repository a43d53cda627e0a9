"""The protocol settings of a run: ``protocols:`` entries, each a named setting of one
registered protocol, resolved and checked against its registry entry on load."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jobs.config.protocol_checks import check_protocol_entry
from jobs.config.typed import check_name

__all__ = ["ProtocolConfig"]


@dataclass
class ProtocolConfig:
    """One named setting of a protocol, e.g. ``knn20`` = knn with n_neighbors 20."""

    name: str
    protocol: str
    settings: dict[str, Any] = field(default_factory=dict)
    layers: list[str] | None = None  # None: every layer each encoder extracts; else only these
    datasets: list[str] | None = None  # None: every dataset

    def check(self, path: str) -> None:
        """Resolve the settings against the protocol's defaults and bounds, naming the entry."""
        check_name(self.name, f"{path}.name")
        check_protocol_entry(self, path)  # its settings resolved by the protocol's registry entry

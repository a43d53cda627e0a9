"""Readout protocols: sklearn-compatible estimators and pure functions (PROTOCOLS.md)."""

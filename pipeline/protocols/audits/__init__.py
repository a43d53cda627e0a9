"""Audits of what a score means: the invariance audit and calibration (ECE, temperature scaling)."""

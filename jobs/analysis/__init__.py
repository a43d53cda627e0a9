"""Analyses over the ledger: correlation against a reference, encoder comparison, checkpoint series, ranks."""

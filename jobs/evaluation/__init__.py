"""Evaluation units of work: one cell (a protocol setting on an encoder's features or weights) to one ledger record, and each cell's memory."""

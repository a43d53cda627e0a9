"""Extraction units of work: encoder forward passes into the store, labels and dense targets, imported features, repair."""

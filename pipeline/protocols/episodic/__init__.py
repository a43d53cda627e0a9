"""Readouts over sampled subsets: few-shot episodes (nearest centroid) and low-shot sweeps."""

"""The dataset adapters, one per publisher's layout; each registers itself with pipeline.datasets.registry when imported."""

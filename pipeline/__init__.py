"""repeval core: encoders, dataset adapters, protocols and statistics (no store, no orchestration)."""

"""The benchmark config: its typed schema, loading and checks, suites, and checkpoint folders."""

"""A run of a benchmark config: the spine every caller walks (``jobs.run.spine.Run``), its
plan (``plan``, ``plan_store``, ``dense_plan``), what changed since the last run
(``changes``), the ledger's answer to an unchanged rerun (``ledger_answer``) and the
failure records a run writes (``failures``)."""

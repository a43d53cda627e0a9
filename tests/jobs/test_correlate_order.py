"""A correlation does not depend on the order the ledger lists its records in (file
listing order varies between stores and runs): same records, bitwise the same report."""

from __future__ import annotations

import random

from jobs.analysis.correlate import correlate_results
from tests.helpers.records import MODELS, linear_records, make_config, synthetic_scores


def test_record_order_changes_no_figure():
    ref, acc = synthetic_scores(MODELS)
    records = linear_records(acc)
    first = correlate_results(records, make_config(MODELS), ref).to_dict()
    for seed in range(3):
        shuffled = list(records)
        random.Random(seed).shuffle(shuffled)
        assert correlate_results(shuffled, make_config(MODELS), ref).to_dict() == first

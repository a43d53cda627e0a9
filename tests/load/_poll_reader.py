"""One reader process of tests/load/test_concurrent_readers.py: poll a store while another
process extracts into it, and record what every open returned.

Usage: python -m tests.load._poll_reader STORE STOPFILE OUT.json KEY [KEY ...]
After STOPFILE appears, one last round of opens is made (the extraction is then complete).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

from pipeline.errors import ArrayNotFoundError, IncompleteArrayError
from storage_schema import FeatureStore


def main() -> None:
    store_url, stop, out, *keys = sys.argv[1:]
    counts = {"opens": 0, "not_found": 0, "incomplete": 0, "complete": 0}
    digests: dict[str, list[str]] = {k: [] for k in keys}
    final = False
    while True:
        final = os.path.exists(stop)  # checked before the round: the last round sees a finished store
        missing = 0
        for key in keys:
            counts["opens"] += 1
            try:
                data = FeatureStore(store_url, read_only=True).open_array(key).read()
            except (ArrayNotFoundError, IncompleteArrayError) as exc:
                missing += isinstance(exc, ArrayNotFoundError)
                counts["not_found" if isinstance(exc, ArrayNotFoundError) else "incomplete"] += 1
                continue
            counts["complete"] += 1
            digests[key].append(hashlib.sha256(data.tobytes()).hexdigest() + f":{data.shape}")
        if final:
            break
        # slower while no array exists yet (the writer is starting: importing torch), so that
        # eight readers leave the cores to it; every 20 ms once it writes
        time.sleep(0.2 if missing == len(keys) else 0.02)
    with open(out, "w") as f:
        json.dump({"counts": counts, "digests": {k: sorted(set(v)) for k, v in digests.items()},
                   "last_round_complete": all(digests[k] for k in keys)}, f)


if __name__ == "__main__":
    main()

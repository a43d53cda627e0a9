"""8 reader processes poll one store while a writer process extracts into it: a reader only
ever gets a complete array (partial ones raise IncompleteArrayError), and whatever a reader
got equals the final array."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

from storage_schema import FeatureStore
from tests.helpers.cli import REPO, cli_command, cli_env

N_READERS = 8
KEYS = [f"features/r18/textures/train/{layer}" for layer in ("pre_logits", "block3")]


@pytest.mark.slow
def test_readers_see_only_complete_arrays_while_a_writer_extracts(tmp_path):
    store = str(tmp_path / "store")
    stop = tmp_path / "writer-done"
    env = cli_env()
    readers = [subprocess.Popen([sys.executable, "-m", "tests.load._poll_reader", store, str(stop),
                                 str(tmp_path / f"reader{i}.json"), *KEYS], env=env, cwd=REPO,
                                stderr=subprocess.PIPE, text=True) for i in range(N_READERS)]
    try:
        writer = subprocess.run(cli_command(store), capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
        assert writer.returncode == 0, writer.stderr
    finally:
        stop.touch()
        errors = [r.communicate(timeout=120)[1] for r in readers]
    assert all(r.returncode == 0 for r in readers), errors
    final = FeatureStore(store, read_only=True)
    expected = {}
    for key in KEYS:
        data = final.open_array(key).read()
        expected[key] = hashlib.sha256(data.tobytes()).hexdigest() + f":{data.shape}"
    totals = {"opens": 0, "not_found": 0, "incomplete": 0, "complete": 0}
    for i in range(N_READERS):
        result = json.loads((tmp_path / f"reader{i}.json").read_text())
        for k, v in result["counts"].items():
            totals[k] += v
        assert result["last_round_complete"], f"reader {i} could not open the finished arrays"
        for key in KEYS:  # every successful open returned exactly the final bytes
            assert result["digests"][key] == [expected[key]], (i, key, result["digests"][key])
    print(f"concurrent readers: {N_READERS} readers x {len(KEYS)} arrays, {totals['opens']} opens during "
          f"one extraction: {totals['not_found']} not yet created, {totals['incomplete']} refused as incomplete "
          f"(IncompleteArrayError), {totals['complete']} complete, all equal to the final array")
    assert totals["complete"] >= N_READERS * len(KEYS)
    assert totals["incomplete"] > 0  # the readers did meet partial arrays, and were refused

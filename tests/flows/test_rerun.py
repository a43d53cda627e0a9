"""`repeval run` of a config with nothing left to do: answered from the store and the ledger
in one line and the run's figures, in a process that never imports Prefect, Dask or torch;
anything that could change a result (a setting, a weights file, the images, a failure, the
report) sends the rerun through the full run again. And every run ends with its figures."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from flows.cli.main import EXIT_PIPE, main
from jobs.run.spine import Run
from storage_schema import FeatureStore
from storage_schema.ledger import FailureLog, Ledger, failure_id
from tests.helpers.cli import REPO, cli_env
from tests.helpers.configs import write_checkpoint

# which heavy libraries the rerun's process imported, printed after the command's own output
PROBE = ("import runpy, sys; sys.argv = ['repeval'] + {args!r}; code = 0\n"
         "try:\n    runpy.run_module('flows.cli', run_name='__main__')\n"
         "except SystemExit as e:\n    code = e.code\n"
         "print('IMPORTED=' + ','.join(m for m in ('torch', 'prefect', 'dask', 'distributed', 'timm') "
         "if m in sys.modules), file=sys.stderr); sys.exit(code)")


def _run(config: Path, *extra: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["run", str(config), *extra])
    return code, out.getvalue()


def _rerun_in_a_fresh_process(config: Path, *extra: str, **popen) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROBE.format(args=["run", str(config), *extra])], text=True,
                          env=cli_env(), cwd=REPO, timeout=120, **({"capture_output": True} | popen))


@pytest.fixture(scope="module")
def stored(tmp_path_factory, prefect_harness):
    """Three encoders' imported features, two settings and a correlation, run once."""
    tmp = tmp_path_factory.mktemp("rerun")
    rng = np.random.default_rng(0)
    y = {"train": np.arange(60) % 3, "test": np.arange(30) % 3}
    arrays = {f"{s}_labels": y[s] for s in y}
    for i, model in enumerate(("a", "b", "c")):
        feats = {f"{s}_features": (rng.normal(size=(len(y[s]), 5)) * (1 + i) + y[s][:, None]).astype(np.float32)
                 for s in y}
        np.savez(tmp / f"{model}.npz", **arrays, **feats)
        assert main(["import-features", "--store", str(tmp / "store"), "--model", model, "--path",
                     str(tmp / f"{model}.npz"), "--dataset-name", "blobs"]) == 0
    (tmp / "reference.csv").write_text("model,score\na,0.7\nb,0.5\nc,0.3\n")
    raw = {"store": str(tmp / "store"), "dask": {"n_workers": 1, "processes": False},
           "encoders": [{"name": m, "source": "store"} for m in ("a", "b", "c")],
           "datasets": [{"name": "blobs", "adapter": "features", "params": {"path": str(tmp / "a.npz")}}],
           "protocols": [{"name": "knn", "protocol": "knn", "settings": {"n_neighbors": 3}},
                         {"name": "ridge", "protocol": "ridge"}],
           "reference": {"csv": str(tmp / "reference.csv")},
           "correlation": {"settings": [{"name": "k-NN", "protocol": "knn", "datasets": ["blobs"]}], "bootstrap": 50},
           "report": {"path": str(tmp / "report.html")}}
    config = tmp / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    code, out = _run(config)
    return {"tmp": tmp, "raw": raw, "config": config, "code": code, "out": out}


def test_a_run_ends_with_the_figures_it_computed_and_the_report(stored):
    assert stored["code"] == 0
    lines = stored["out"].splitlines()
    assert lines[-2].startswith("  k-NN: Pearson r = ") and lines[-2].endswith(", n = 3 encoders")
    assert lines[-1] == f"report: {stored['tmp'] / 'report.html'}"


def test_a_rerun_with_nothing_to_do_answers_from_the_ledger_without_prefect_dask_or_torch(stored):
    out = _rerun_in_a_fresh_process(stored["config"])
    assert out.returncode == 0, out.stderr[-3000:]
    first, *figures = out.stdout.splitlines()
    assert first.startswith("nothing to do: all 6 cells and 0 extractions are in the ledger and the store")
    assert first.endswith(f"report: {stored['tmp'] / 'report.html'}")
    assert figures == stored["out"].splitlines()[-2:-1]  # the run's own figures, as it printed them
    assert out.stderr.strip() == "IMPORTED="  # no progress lines, no Prefect, Dask, torch or timm
    summary = json.loads(_rerun_in_a_fresh_process(stored["config"], "--json").stdout)
    assert summary["nothing_to_do"] and summary["computed"] == 0 and summary["cached"] == 6


def test_the_answer_ends_quietly_on_a_closed_pipe(stored):
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        out = _rerun_in_a_fresh_process(stored["config"], stdout=write_end, stderr=subprocess.PIPE,
                                        capture_output=False)
    finally:
        os.close(write_end)
    assert out.returncode == EXIT_PIPE and out.stderr.strip() == "IMPORTED="


def test_anything_that_could_change_a_result_takes_the_full_run(stored, tmp_path):
    config, raw = stored["config"], stored["raw"]
    assert Run(config).ledger_answer() is not None
    changed = dict(raw, protocols=[dict(raw["protocols"][0], settings={"n_neighbors": 5}), raw["protocols"][1]])
    assert Run(changed).ledger_answer() is None  # a setting: new cells
    elsewhere = dict(raw, report={"path": str(tmp_path / "other.html")})
    assert Run(elsewhere).ledger_answer() is None  # a report not written yet
    reference = stored["tmp"] / "reference.csv"
    saved, times = reference.read_text(), (reference.stat().st_atime_ns, reference.stat().st_mtime_ns)
    try:
        reference.write_text(saved.replace("0.3", "0.2"))
        assert Run(config).ledger_answer() is None  # the reference file: other figures
        reference.write_text(saved)
        assert Run(config).ledger_answer() is None  # ... even written back (its time changed)
    finally:
        reference.write_text(saved)
        os.utime(reference, ns=times)
    assert Run(config).ledger_answer() is not None  # as it was: the module's other tests expect it


def test_a_failure_or_a_lost_record_takes_the_full_run(stored):
    store = FeatureStore(str(stored["tmp"] / "store"))
    fid = failure_id("a", "blobs", "pre_logits", "knn")
    FailureLog(store).record("cell", fid, {"label": "a/blobs/pre_logits:knn", "reason": "OSError: disk"})
    assert Run(stored["config"]).ledger_answer() is None  # a full run retries what failed
    FailureLog(store).clear("cell", fid)
    assert Run(stored["config"]).ledger_answer() is not None
    record = next(iter(Ledger(store)))
    path = next((stored["tmp"] / "store" / "_repeval" / "ledger").rglob(f"{record['cell_id']}.json"))
    kept = path.read_bytes()
    path.unlink()  # a record gone (another tool, a restore): the cell is to be evaluated
    try:
        assert Run(stored["config"]).ledger_answer() is None
    finally:
        path.write_bytes(kept)
    report = stored["tmp"] / "report.html"
    report.rename(report.with_suffix(".bak"))
    try:
        assert Run(stored["config"]).ledger_answer() is None  # the report is gone: written again
    finally:
        report.with_suffix(".bak").rename(report)
    assert Run(stored["config"]).ledger_answer() is not None


@pytest.mark.slow
def test_extracted_features_are_checked_against_their_weights_and_images(tmp_path, prefect_harness):
    """An extracting config: a rerun is answered only while the checkpoint file and the
    images are those the stored arrays were computed from."""
    ck = write_checkpoint(tmp_path / "ck", "ep1", seed=1)
    images = tmp_path / "images"
    for split in ("train", "test"):
        for k, cls in enumerate(("cat", "dog")):
            (images / split / cls).mkdir(parents=True)
            for i in range(6 if split == "train" else 3):
                Image.new("RGB", (16, 16), (40 * i, 120 * k, 0)).save(images / split / cls / f"{i}.png")
    raw = {"store": str(tmp_path / "store"), "dask": {"n_workers": 1, "processes": False},
           "extract": {"batch_size": 8},
           "encoders": [{"name": "ep1", "arch": "resnet18", "input_size": 32, "weights": str(ck)}],
           "datasets": [{"name": "pics", "adapter": "image_folder", "params": {"root": str(images)}}],
           "protocols": [{"name": "knn", "protocol": "knn", "settings": {"n_neighbors": 3}}],
           "report": {"path": str(tmp_path / "report.html")}}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    assert _run(config)[0] == 0
    out = _rerun_in_a_fresh_process(config)
    assert out.stdout.startswith("nothing to do: all 1 cells and 2 extractions") and out.stderr.strip() == "IMPORTED="
    Image.new("RGB", (16, 16), (1, 2, 3)).save(images / "test" / "dog" / "9.png")  # a new test image
    assert Run(config).ledger_answer() is None
    (images / "test" / "dog" / "9.png").unlink()
    assert Run(config).ledger_answer() is not None
    os.utime(ck, ns=(ck.stat().st_atime_ns, ck.stat().st_mtime_ns + 10**9))  # the checkpoint rewritten
    assert Run(config).ledger_answer() is None
    code, text = _run(config)
    assert code == 0 and "nothing to do" not in text  # the full run checked it: same weights, same arrays
    assert Run(config).ledger_answer() is not None

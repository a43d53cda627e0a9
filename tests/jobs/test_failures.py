"""Failure records: written for what failed, cleared by a later success, one line each;
and the run summary built from them (terminal lines, the flow's message, the artifact)."""

from __future__ import annotations

from jobs.evaluation.evaluate import Cell
from jobs.run.failures import cell_failure, correlation_failure, extraction_failure, one_line, sync_failures
from jobs.report.run_summary import build_summary, failure_message, summary_lines, summary_table
from pipeline.errors import CheckpointError, CorruptImageError, DataValidationError, StoreFullError
from storage_schema import FeatureStore
from storage_schema.ledger import FailureLog, failure_id

CELL = Cell("r18", "tex", "block3", "few5", "fewshot", {"n_way": 5})


def _ok(cell: Cell) -> dict:
    return {"label": cell.label(), "model": cell.model, "dataset": cell.dataset, "layer": cell.layer,
            "setting": cell.setting, "cell_id": "c" * 32, "status": "computed"}


def test_one_line_reasons():
    assert one_line(DataValidationError("n_way=5 needs at least 5 classes\nmore detail")) == \
        "DataValidationError: n_way=5 needs at least 5 classes"
    assert one_line(CorruptImageError("Cannot decode image '/d/a/1.png': truncated")).endswith(
        "to leave unreadable images out, set skip_bad: true in the dataset's params")
    assert len(one_line(ValueError("x" * 1000))) < 420


def test_a_failure_is_recorded_counted_and_cleared_by_a_later_success(tmp_path):
    store = FeatureStore(str(tmp_path / "store"))
    log = FailureLog(store)
    reason = one_line(DataValidationError("n_way=5 needs at least 5 classes, but y has only 4"))
    for attempt in (1, 2):
        written = sync_failures(store, cells=[cell_failure(CELL, reason, "DataValidationError")])
        assert [(r["label"], r["attempts"]) for r in written] == [("r18/tex/block3:few5", attempt)]
    rec = log.get("cell", failure_id("r18", "tex", "block3", "few5"))
    assert rec["reason"] == reason and rec["setting"] == "few5" and rec["first_failed"] <= rec["recorded"]
    assert "status" not in rec  # an outcome's bookkeeping stays out of the record
    sync_failures(store, cells=[_ok(CELL)])
    assert log.records() == []


def test_a_checkpoint_error_in_extraction_is_held_against_the_scanned_file(tmp_path):
    store = FeatureStore(str(tmp_path / "store"))
    bad = extraction_failure("ep3", "tex", "train", "/ck/ep3.safetensors", CheckpointError("truncated"), "resnet18")
    sync_failures(store, extractions=[bad], scanned={"ep3": (1234, 99)})
    kinds = {r["kind"]: r for r in FailureLog(store).records()}
    assert set(kinds) == {"extraction", "checkpoint"}
    assert (kinds["checkpoint"]["file"], kinds["checkpoint"]["size"], kinds["checkpoint"]["mtime_ns"]) == \
        ("/ck/ep3.safetensors", 1234, 99)
    done = {"model": "ep3", "dataset": "tex", "split": "train", "weights": "/ck/ep3.safetensors",
            "status": "extracted"}
    sync_failures(store, extractions=[done])
    assert FailureLog(store).records() == []


def test_correlation_failure_and_its_clearing(tmp_path):
    store = FeatureStore(str(tmp_path / "store"))
    sync_failures(store, correlation=correlation_failure("/r/report.html", StoreFullError("disk full")))
    assert FailureLog(store).records("correlation")[0]["reason"] == "StoreFullError: disk full"
    sync_failures(store, report_path="/r/report.html")
    assert FailureLog(store).records() == []


def test_a_read_only_store_still_reports_the_failures(tmp_path):
    FeatureStore(str(tmp_path / "store"))
    store = FeatureStore(str(tmp_path / "store"), read_only=True)
    assert sync_failures(store, cells=[cell_failure(CELL, "x", "ValueError")]) == []  # logged, not raised


def test_summary_lists_every_failure_and_says_why_the_run_started():
    fails = [cell_failure(CELL, "DataValidationError: n_way=5 needs at least 5 classes", "DataValidationError"),
             {"kind": "checkpoint", "label": "/ck/bad.safetensors", "reason": "CheckpointError: truncated"}]
    summary = build_summary(reason="scan: new checkpoints", units=2, cells=3, extractions=[], outcomes=[fails[0]],
                            failures=fails, report="/r/report.html", correlation=None, started=0.0,
                            new_encoders=["ep3"], waiting=["/ck/ep4.safetensors"])
    lines = summary_lines(summary)
    assert lines[0].startswith("scan: new checkpoints: extracted 0 of 2") and "1 failed" in lines[0]
    assert "new encoders: ep3" in lines and "FAILED (2):" in lines
    assert "  cell r18/tex/block3:few5: DataValidationError: n_way=5 needs at least 5 classes" in lines
    assert "  checkpoint /ck/bad.safetensors: CheckpointError: truncated" in lines
    assert any(line.startswith("waiting: /ck/ep4.safetensors is still being written") for line in lines)
    assert failure_message(summary).startswith("1 cell, 1 checkpoint failed: r18/tex/block3:few5")
    rows = summary_table(summary)
    assert {"item": "why it ran", "value": "scan: new checkpoints"} in rows
    assert {"item": "failed checkpoint", "value": "/ck/bad.safetensors: CheckpointError: truncated"} in rows
    assert failure_message({**summary, "failures": []}) is None


def test_cells_of_a_failed_extraction_fail_with_its_reason(tmp_path):
    import dataclasses

    from flows.tasks import evaluate_task

    FeatureStore(str(tmp_path / "store"))
    failed = extraction_failure("r18", "tex", "train", "/ck/r18.safetensors",
                                CorruptImageError("Cannot decode image '/d/a/1.png'"))
    out = evaluate_task.fn({"url": str(tmp_path / "store")}, [dataclasses.asdict(CELL)], [failed])
    assert [o["status"] for o in out] == ["failed"] and out[0]["error_type"] == "ExtractionFailed"
    assert out[0]["reason"].startswith("not evaluated: extraction r18/tex/train failed: CorruptImageError")

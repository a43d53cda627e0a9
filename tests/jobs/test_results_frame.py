"""What a notebook reads: ``repeval results --format csv|parquet|json`` and
``jobs.report.results.results_frame``, typed, with each checkpoint's series, step, file and epoch."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from flows.cli import main
from jobs.report.results import results_frame
from storage_schema import FeatureStore
from storage_schema.ledger import Ledger
from tests.helpers.records import make_record
from tests.helpers.small_series import series_config, write_series

NOISE = {100: 6.0, 200: 0.5}  # two checkpoints: epochs 1 and 2 in their safetensors headers


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("series")
    raw = series_config(tmp)
    write_series(tmp, raw, NOISE)
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return tmp, raw, path


def test_results_frame_has_typed_series_columns(series):
    _, raw, _ = series
    frame = results_frame(raw)
    assert len(frame) == 6  # 2 checkpoints x 3 settings
    assert list(frame.columns[:8]) == ["model", "series", "step", "epoch", "dataset", "layer", "setting", "protocol"]
    assert str(frame["recorded"].dtype).startswith("datetime64") and str(frame["recorded"].dt.tz) == "UTC"
    assert frame["step"].dtype == "Int64" and frame["epoch"].dtype == "Int64"
    by_model = frame.drop_duplicates("model").set_index("model")
    assert by_model["step"].to_dict() == {"ck-step100": 100, "ck-step200": 200}
    assert by_model["epoch"].to_dict() == {"ck-step100": 1, "ck-step200": 2}  # the headers' metadata
    assert set(frame["series"]) == {"run7"}
    assert by_model.loc["ck-step200", "checkpoint"].endswith("run7/ck-step200.safetensors")
    knn = frame[frame["setting"] == "knn"].iloc[0]
    assert json.loads(knn["settings"])["n_neighbors"] == 10  # the full settings, as JSON
    # the better checkpoint (less noise) scores higher: the score is the step's own
    scores = frame[frame["setting"] == "knn"].set_index("step")["metric.score"]
    assert scores[200] > scores[100]


def test_exports_keep_the_types(series, capsys):
    tmp, _, config = series
    parquet, csv, js = tmp / "r.parquet", tmp / "r.csv", tmp / "r.json"
    for fmt, path in (("parquet", parquet), ("csv", csv), ("json", js)):
        assert main(["results", "--config", str(config), "--format", fmt, "--output", str(path)]) == 0
    assert "wrote" in capsys.readouterr().out

    schema = pq.read_schema(parquet)
    assert pa.types.is_timestamp(schema.field("recorded").type) and schema.field("recorded").type.tz == "UTC"
    assert pa.types.is_integer(schema.field("step").type) and pa.types.is_integer(schema.field("epoch").type)
    if hasattr(pa, "json_"):
        assert schema.field("settings").type == pa.json_()
    frame, entry = pd.read_parquet(parquet), results_frame(config)
    # the file is the entry point's table: every column, its type and its missing values
    pd.testing.assert_frame_equal(frame, entry)
    assert sorted(frame["step"].unique()) == [100, 200]
    # whole numbers stay integers where some records lack them (the ridge's validation rows)
    assert entry["diag.n_val"].dtype == "Int64" and entry["diag.n_val"].isna().any()
    assert entry["diag.n_val"].dropna().ge(0).all() and entry["dim"].dtype == "Int64"
    assert entry["converged"].dtype == "boolean" and entry["unreliable"].dtype == "boolean"
    untrusted = entry[entry["unreliable"]]  # a grid_edge ridge is marked in the export too
    assert len(untrusted) and untrusted["warnings"].str.contains("grid_edge").all()

    from_csv = pd.read_csv(csv, parse_dates=["recorded"], dtype_backend="numpy_nullable")
    assert str(from_csv["recorded"].dt.tz) == "UTC" and sorted(from_csv["step"].unique()) == [100, 200]
    assert from_csv["diag.n_val"].dtype == "Int64" and from_csv["unreliable"].dtype == "boolean"
    assert from_csv["diag.n_val"].isna().tolist() == entry["diag.n_val"].isna().tolist()
    written = pd.read_csv(csv, dtype=str, keep_default_na=False)["diag.n_val"]
    assert all(v == "" or v.isdigit() for v in written) and any(written)  # no whole number written as 18.0

    records = json.loads(js.read_text())
    assert {(r["model"], r["series"], r["step"], r["epoch"]) for r in records} == {
        ("ck-step100", "run7", 100, 1), ("ck-step200", "run7", 200, 2)}
    flat = pd.json_normalize(records)
    assert "settings.n_neighbors" in flat and "metrics.score" in flat


def test_results_table_shows_steps(series, capsys):
    _, _, config = series
    assert main(["results", "--config", str(config)]) == 0
    header = capsys.readouterr().out.splitlines()[0].split()
    assert header[:2] == ["model", "step"]


def test_store_records_carry_their_weights_fingerprint(tmp_path):
    store = FeatureStore(str(tmp_path / "store"))
    rec = make_record("r18-a", "pets", "linear", {"score": 0.7, "top1": 0.7}, weights="w1")
    Ledger(store).put(rec)
    frame = results_frame(store=str(tmp_path / "store"))
    row = frame.iloc[0]
    assert row["weights_fingerprint"] == rec["provenance"]["weights_fingerprint"]
    assert pd.isna(row["series"]) and pd.isna(row["step"])  # no config: no series known
    assert frame["recorded"].iloc[0] == pd.Timestamp("2025-01-01", tz="UTC")
    assert results_frame(store=store, failed=True).empty


def test_the_documented_snippets_run(series, monkeypatch):
    """docs/results.md's read-back and plot snippets, on this series (named run7, as there)."""
    import re

    import matplotlib

    from tests.helpers.cli import REPO

    matplotlib.use("Agg")
    tmp, _, config = series
    monkeypatch.chdir(tmp)
    (tmp / "nightly.yaml").write_text(config.read_text())
    for fmt in ("parquet", "csv", "json"):
        assert main(["results", "--config", "nightly.yaml", "--format", fmt, "--output", f"results.{fmt}"]) == 0
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "results.md").read_text(encoding="utf-8"), re.S)
    read_back, plot = (b for b in blocks if "read_parquet" in b or "savefig" in b)
    scope: dict = {}
    exec(read_back, scope)  # noqa: S102  the document's own code
    assert len(scope["best"]) == 3 and set(scope["best"]["step"]) <= {100, 200}
    exec(plot, {})  # noqa: S102
    assert (tmp / "score-by-step.png").stat().st_size > 0


def test_the_docs_name_the_validation_the_records_say(series):
    """docs/protocols.md says where each protocol's validation rows came from in the words
    the records use (ridge: its leave-one-out holds no row out)."""
    from tests.helpers.cli import REPO

    _, raw, _ = series
    frame = results_frame(raw)
    ridge = frame[frame["protocol"] == "ridge"]
    assert len(ridge) and set(ridge["diag.validation"]) == {"exact leave-one-out on train"}
    assert set(ridge["diag.n_val"]) == {0}
    docs = " ".join((REPO / "docs" / "protocols.md").read_text(encoding="utf-8").split())
    assert "`exact leave-one-out on train` for ridge's alpha search, which holds no row out (`n_val: 0`)" in docs
    assert "ridge's leave-one-out)" not in docs  # not among the "none: ..." cases

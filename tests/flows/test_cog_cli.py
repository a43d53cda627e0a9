"""``repeval cog-levels`` on the hand-made hierarchy of tests/pipeline/test_cog.py (its
similarities and levels are worked out there): the summary printed, the manifests, and a
config fragment that plans the paper's evaluation of every level."""

from __future__ import annotations

import csv

import pytest
import yaml
from PIL import Image

from flows.cli.main import main
from jobs.config import load_config
from jobs.run.plan import check_plan, evaluation_cells
from tests.pipeline.test_cog import COUNTS, DESCENDANTS, EDGES, EXCLUDED, EXPECTED, RANKED, SEEN


def _write(path, lines):
    path.write_text("".join(f"{line}\n" for line in lines))
    return str(path)


@pytest.fixture
def files(tmp_path):
    meta = tmp_path / "meta"
    meta.mkdir()
    images = tmp_path / "images"
    for concept in RANKED:
        (images / concept).mkdir(parents=True)
        for i in range(6):
            Image.new("RGB", (8, 8), (i * 40, 0, 0)).save(images / concept / f"{i}.png")
    return {
        "--is-a": _write(meta / "wordnet.is_a.txt", [f"{p} {c}" for p, c in EDGES]),
        "--words": _write(meta / "words.txt", [f"{n}\t{n.replace('_', ' ')}" for n in DESCENDANTS | COUNTS]),
        "--counts": _write(meta / "counts.txt", [f"{n} {k}" for n, k in COUNTS.items()]),
        "--seen": _write(meta / "in1k.txt", SEEN),
        "--exclude": _write(meta / "excluded.txt", EXCLUDED),
        "--images": str(images),
    }


def _args(files, out, **extra):
    args = ["cog-levels", "--out", str(out), "--root", "entity", "--person", "person", "--n-levels", "3",
            "--level-size", "2", "--n-test", "2", "--max-train", "3"]
    for k, v in {**files, **extra}.items():
        args += [k, v] if v is not None else []
    return args


def test_cog_levels_prints_the_summary_and_writes_manifests_and_a_config_fragment(tmp_path, files, capsys):
    out = tmp_path / "levels"
    assert main(_args(files, out)) == 0
    printed = capsys.readouterr().out
    lines = printed.splitlines()
    assert lines[0].split() == ["level", "n_concepts", "similarity_max", "similarity_min", "similarity_mean",
                                "n_train_images", "n_test_images"]
    assert lines[1].split()[:3] == ["1", "2", f"{EXPECTED['fox_terrier']:.4f}"]
    assert lines[2].split()[3] == f"{EXPECTED['boat']:.4f}" and lines[3].split()[-2:] == ["6", "4"]
    assert "6 concepts in 3 levels" in printed and "cog.yaml" in printed
    with open(out / "level_1.csv", newline="") as fh:
        assert {row["label"] for row in csv.DictReader(fh)} == {"fox_terrier", "lynx"}
    fragment = yaml.safe_load((out / "cog.yaml").read_text())
    assert [d["name"] for d in fragment["datasets"]] == ["cog-l1", "cog-l2", "cog-l3"]
    lowshot = fragment["protocols"][1]["settings"]
    assert lowshot == {"probe": "logistic", "transform": "l2", "shots": [1, 2, 4, 8, 16, 32, 64, 128, "all"],
                       "n_seeds": 5}
    config = load_config({"store": str(tmp_path / "store"), "report": {"path": str(tmp_path / "r.html")},
                          "encoders": [{"name": "r18", "arch": "resnet18", "input_size": 32}], **fragment})
    check_plan(config)  # the manifests load with the csv_manifest adapter
    cells = {(c.dataset, c.setting) for c in evaluation_cells(config)}
    assert cells == {(f"cog-l{k}", s) for k in (1, 2, 3) for s in ("cog-linear", "cog-lowshot")}


def test_without_images_only_the_concepts_and_summary_are_written(tmp_path, files, capsys):
    out = tmp_path / "levels"
    assert main(_args({k: v for k, v in files.items() if k != "--images"}, out)) == 0
    assert sorted(p.name for p in out.iterdir()) == ["concepts.csv", "summary.csv"]


@pytest.mark.parametrize("change, message", [
    ({"--seen": "/nonexistent/in1k.txt"}, "--seen '/nonexistent/in1k.txt' is not a file"),
    ({"--images": "/nonexistent/images"}, "--images '/nonexistent/images' is not a folder"),
    ({"--n-test": "0"}, "n_test"),
    ({"--level-size": "5"}, "eligible"),
])
def test_mistakes_exit_2_with_one_line_and_write_nothing(tmp_path, files, capsys, change, message):
    out = tmp_path / "levels"
    assert main(_args({**files, **change}, out)) == 2
    err = capsys.readouterr().err
    assert err.startswith("repeval: error:") and message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()

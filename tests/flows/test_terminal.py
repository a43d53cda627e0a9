"""The command line at a terminal: a closed pipe ends any command quietly, names from data
are printed escaped, and every command that reads the store takes ``--config``."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import yaml
from PIL import Image

from flows.cli.main import EXIT_PIPE, build_parser, main
from jobs.evaluation.evaluate import Cell, evaluate_cell
from storage_schema import ArraySpec, FeatureStore
from storage_schema.ledger import FailureLog, failure_id
from tests.helpers.cli import REPO, cli_env

EVIL = ["evil\x1b]0;pwned\x07", "red\x1b[31mX", "two\nlines"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Two encoders' features, a few evaluated cells, a config naming the store."""
    tmp = tmp_path_factory.mktemp("terminal")
    rng = np.random.default_rng(0)
    for model in ("a", "b"):
        arrays = {}
        for split, n in (("train", 60), ("test", 30)):
            y = np.arange(n) % 3
            arrays[f"{split}_features"] = (rng.normal(size=(n, 5)) + y[:, None]).astype(np.float32)
            arrays[f"{split}_labels"] = y
        np.savez(tmp / f"{model}.npz", **arrays)
        assert main(["import-features", "--store", str(tmp / "store"), "--model", model, "--path",
                     str(tmp / f"{model}.npz"), "--dataset-name", "blobs"]) == 0
    st = FeatureStore(str(tmp / "store"))
    for model in ("a", "b"):
        for k in (3, 5):
            evaluate_cell(st, Cell(model, "blobs", "pre_logits", f"knn{k}", "knn", {"n_neighbors": k}))
    config = tmp / "config.yaml"
    config.write_text(yaml.safe_dump({
        "store": str(tmp / "store"), "encoders": [{"name": m, "source": "store"} for m in ("a", "b")],
        "datasets": [{"name": "blobs", "adapter": "features", "params": {"path": str(tmp / "a.npz")}}],
        "protocols": [{"name": f"knn{k}", "protocol": "knn", "settings": {"n_neighbors": k}} for k in (3, 5)],
        "report": {"path": str(tmp / "report.html")}}))
    return {"tmp": tmp, "store": str(tmp / "store"), "config": str(config)}


COMMANDS = [
    ["--help"], ["protocols"], ["protocols", "knn", "--json"], ["datasets"], ["datasets", "show", "textures"],
    ["ls", "--store", "{store}"], ["ls", "--config", "{config}", "--json"], ["verify", "--config", "{config}", "--all"],
    ["results", "--store", "{store}"], ["results", "--config", "{config}", "--ranks"],
    ["results", "--config", "{config}", "--failed"], ["compare", "a", "b", "--config", "{config}"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_a_closed_pipe_ends_every_command_quietly(store, args):
    """The reader is gone before the command writes anything (``| head`` that already left)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        out = subprocess.run([sys.executable, "-m", "flows.cli", *(a.format(**store) for a in args)],
                             stdout=write_end, stderr=subprocess.PIPE, text=True, env=cli_env(), cwd=REPO,
                             timeout=120)
    finally:
        os.close(write_end)
    assert out.stderr == "" and out.returncode in (0, EXIT_PIPE), (out.returncode, out.stderr[-2000:])


def test_head_of_a_listing_ends_quietly_in_a_shell_pipeline(store):
    command = f"{sys.executable} -m flows.cli results --store {store['store']} --all | head -1"
    out = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True, env=cli_env(),
                         cwd=REPO, timeout=120)
    assert out.stdout.startswith("model") and len(out.stdout.splitlines()) == 1
    assert out.stderr == "" and out.returncode in (0, EXIT_PIPE)


def test_a_closed_pipe_in_process_returns_the_sigpipe_code(store, monkeypatch):
    read_end, write_end = os.pipe()
    os.close(read_end)
    with open(write_end, "w") as closed:
        monkeypatch.setattr(sys, "stdout", closed)
        assert main(["ls", "--store", store["store"]]) == EXIT_PIPE
        monkeypatch.undo()


def test_class_folder_names_are_printed_escaped(tmp_path, capsys):
    for split in ("train", "test"):
        for cls in ["plain", *EVIL]:
            (tmp_path / split / cls).mkdir(parents=True)
            for i in range(2):
                Image.new("RGB", (8, 8), (60 * i, 0, 0)).save(tmp_path / split / cls / f"{i}.png")
    assert main(["datasets", "show", "image_folder", "--param", f"root={tmp_path}", "--name", "mine"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "two\nlines" not in out
    assert "evil\\x1b]0;pwned\\x07" in out and "red\\x1b[31mX" in out and "two\\nlines" in out


def test_store_attributes_and_failure_reasons_are_printed_escaped(tmp_path, capsys):
    st = FeatureStore(str(tmp_path / "s"))
    key = "datasets/blobs/train/labels"
    with st.lease("datasets/blobs/train") as lease:
        st.write_arrays(lease, [ArraySpec(key, (4,), 4, "int64", {"fingerprint": "f", "skipped_ids": EVIL})],
                        lambda todo: [(0, {key: np.zeros(4, np.int64)})])
    FailureLog(st).record("cell", failure_id("a", "blobs", "pre_logits", "knn"), {
        "label": "a/blobs/pre_logits:knn", "reason": f"CorruptImageError: cannot read {EVIL[0]}/0.png\nsecond"})
    for args, forged in ((["ls"], "two\\nlines"), (["results", "--failed"], "0.png\\nsecond")):
        assert main([*args, "--store", str(tmp_path / "s")]) == 0
        out = capsys.readouterr().out
        assert "\x1b" not in out and "\x07" not in out and "evil\\x1b]0;pwned\\x07" in out, out
        assert forged in out  # a newline in a value is shown, not obeyed


def test_progress_lines_of_a_run_are_one_line_each(capsys):
    from flows.benchmark import say

    say("run", f"data: 1 unreadable image(s) left out of mine/train: {EVIL[2]}/{EVIL[0]}")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err and "two\\nlines/evil\\x1b]0;pwned\\x07" in err


def test_every_command_that_reads_the_store_takes_config(store, capsys):
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # noqa: SLF001  argparse keeps them here
    with_store = {name for name, sub in commands.items()
                  if any("--store" in a.option_strings for a in sub._actions)}  # noqa: SLF001
    assert with_store == {"extract", "ls", "verify", "repair", "import-features", "results", "compare"}
    assert all(any("--config" in a.option_strings for a in commands[n]._actions) for n in with_store)  # noqa: SLF001
    assert main(["ls", "--config", store["config"]]) == 0
    assert "features/a/blobs/train/pre_logits" in capsys.readouterr().out
    assert main(["verify", "--config", store["config"]]) == 0
    assert "0 problem(s)" in capsys.readouterr().out
    assert main(["import-features", "--config", store["config"], "--model", "c", "--path",
                 str(store["tmp"] / "a.npz"), "--dataset-name", "blobs"]) == 0
    assert "features/c/blobs/train/pre_logits" in capsys.readouterr().out


def test_ls_without_a_store_says_how_to_name_one(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["ls"]) == 2
    err = capsys.readouterr().err
    assert "no repeval store at './repeval-store' (the default)" in err and "--config CONFIG" in err

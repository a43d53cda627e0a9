"""``repeval protocols`` and ``repeval datasets``: the registries' settings and parameters,
with defaults and valid values, printed without importing torch or any heavy library."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import pytest

from flows.cli.main import main
from tests.flows.test_imports import HEAVY
from tests.helpers.cli import REPO, cli_env


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_protocols_lists_every_protocol_with_its_defaults(capsys):
    from pipeline.protocols import get_protocol, list_protocols

    code, out, _ = _run(capsys, "protocols")
    assert code == 0
    for name in list_protocols():
        proto = get_protocol(name)
        assert f"{name} (version {proto.version}): {proto.description}" in out
        block = out.split(f"{name} (version", 1)[1].split("\n\n", 1)[0]
        for setting in proto.defaults:
            assert f"{setting}=" in block, f"{name}: {setting} missing from the listing"


def test_one_protocol_shows_defaults_choices_and_ranges(capsys):
    code, out, _ = _run(capsys, "protocols", "knn")
    assert code == 0
    rows = {line.split()[0]: line.split(None, 2)[1:] for line in out.splitlines()[3:] if line.strip()}
    assert rows["n_neighbors"] == ["20", "integer >= 1"]
    assert rows["metric"] == ["cosine", "cosine, euclidean"]
    assert rows["temperature"] == ["0.07", "> 0"]
    assert rows["device"][1] == "auto, cpu, cuda, cuda:<i>"
    assert ("streams train: yes; multi-label: no; reads: pooled features; metrics: score, top1, mean_per_class "
            "(primary: score)") in out


def test_protocols_json_is_the_registry(capsys):
    from pipeline.protocols import get_protocol

    code, out, _ = _run(capsys, "protocols", "logistic", "--json")
    record = json.loads(out)
    proto = get_protocol("logistic")
    assert code == 0 and record["multilabel"] is True and record["streams_train"] is False
    assert {s["name"]: s["default"] for s in record["settings"]} == dict(proto.defaults)
    assert next(s for s in record["settings"] if s["name"] == "seed")["valid"] == "integer >= 0 and <= 4294967295"
    assert record["metrics"] == list(proto.metrics) and record["primary_metric"] == "score"
    assert record["unbounded"] == ["nll", "nll_temperature_scaled"]


def test_unknown_protocol_is_one_line_with_the_valid_names(capsys):
    code, _, err = _run(capsys, "protocols", "knnn")
    assert code == 2 and err.count("\n") == 1 and "knn" in err and "logistic" in err and "finetune" in err


def test_encoder_protocols_are_listed_with_their_defaults(capsys):
    from pipeline.protocols import get_protocol, list_protocols

    code, out, _ = _run(capsys, "protocols")
    assert code == 0 and "Encoder protocols" in out
    for name in [n for n in list_protocols() if get_protocol(n).reads == "weights"]:
        block = out.split(f"{name} (version", 1)[1].split("\n", 3)[2]
        assert all(f"{k}=" in block for k in get_protocol(name).defaults), block
    code, out, _ = _run(capsys, "protocols", "finetune")
    rows = dict(line.split(None, 1) for line in out.splitlines()[4:] if line.strip())
    assert code == 0 and rows["steps"] == "5000" and rows["weight_decays"] == "[0, 1e-06, 1e-05, 0.0001, 0.001]"
    assert "not part of a result's identity: save_every, eval_batch_size, num_workers" in out
    code, out, _ = _run(capsys, "protocols", "colour_detail", "--json")
    record = json.loads(out)
    assert record["reads"] == "weights" and record["multilabel"] is True and "perceptual_distance" in record["metrics"]
    assert {s["name"]: s["default"] for s in record["settings"]} == get_protocol("colour_detail").defaults


@pytest.mark.parametrize("argv", [("datasets",), ("datasets", "list")])
def test_datasets_lists_every_adapter_with_its_parameters(capsys, argv):
    from pipeline.datasets import adapter_class, list_datasets

    code, out, _ = _run(capsys, *argv)
    assert code == 0
    lines = out.splitlines()
    for adapter in list_datasets():
        head = next(i for i, line in enumerate(lines) if line.startswith(f"{adapter}: metric"))
        params = lines[head + 1]
        for name, p in inspect.signature(adapter_class(adapter).__init__).parameters.items():
            if name in ("self", "name"):
                continue
            expected = f"{name} (required)" if p.default is inspect.Parameter.empty else f"{name}="
            assert expected in params, f"{adapter}: {expected!r} not in {params!r}"
    assert "content_hash=false" in out and "test_size=0.25" in out


def test_datasets_json_gives_defaults_and_required_parameters(capsys):
    code, out, _ = _run(capsys, "datasets", "--json")
    records = {r["adapter"]: r for r in json.loads(out)}
    assert code == 0
    caltech = {p["name"]: p for p in records["caltech101"]["parameters"]}
    assert caltech["root"]["required"] and caltech["train_per_class"]["default"] == 30
    assert records["voc2007"]["multi_label"] and records["features"]["images"] is False
    assert records["aircraft"]["splits"] == {"train": "train", "val": "val", "test": "test", "pooled": "all"}


def test_datasets_show_still_reads_a_copy(capsys):
    code, out, _ = _run(capsys, "datasets", "show", "textures", "--param", 'n_per_class={"train": 3, "test": 2}')
    assert code == 0 and "dataset textures (adapter textures)" in out and "train" in out


def test_registry_commands_import_no_heavy_library():
    """Measured the way a user runs them: a fresh interpreter, then the modules it loaded."""
    code = ("import sys\nfrom flows.cli.main import main\n"
            "for argv in (['protocols'], ['protocols', 'lowshot'], ['datasets'], ['datasets', '--json']):\n"
            "    assert main(argv) == 0\n"
            f"print('HEAVY', sorted(h for h in {HEAVY!r} if h in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), cwd=REPO,
                         timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "HEAVY []"

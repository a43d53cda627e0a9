"""The config check: every mistake reported at once, each with its field path; oversized
input (a YAML alias bomb, a huge value) refused first with one short line."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import yaml

from flows.cli.main import main
from jobs.config import EncoderConfig, load_config
from jobs.config.mistakes import MAX_FILE_BYTES, MAX_STRING, MAX_VALUES, ConfigMistakes, Mistakes
from jobs.run.plan import make_plan
from pipeline.encoders.spec import EncoderSpec
from pipeline.errors import ConfigError
from pipeline.plain import to_plain
from tests.helpers.configs import tiny_config


def _messages(raw) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(raw)
    return str(info.value).splitlines()


def test_every_mistake_of_the_fields_is_reported_at_once(tmp_path):
    raw = tiny_config(tmp_path)
    raw["encoders"][0]["seed"] = "zero"
    raw["encoders"][1]["archh"] = "resnet18"
    raw["encoders"][2]["input_size"] = [32]
    del raw["datasets"][0]["adapter"]
    raw["protocols"][0]["settings"] = {"n_neighbours": 3}
    raw["dask"]["n_workers"] = "two"
    raw["extrct"] = {}
    lines = _messages(raw)
    starts = ["config.datasets[0].adapter: missing required field", "config.dask.n_workers: expected int",
              "config.encoders[0].seed: expected int, got str 'zero'", "config.encoders[1].archh: unknown field",
              "config.encoders[2].input_size: ", "config.extrct: unknown field",
              "config.protocols[0]: settings.n_neighbours"]
    assert len(lines) == len(starts), lines
    for start in starts:
        assert sum(line.startswith(start) for line in lines) == 1, (start, lines)
    assert not (tmp_path / "store").exists()


def test_every_mistake_between_fields_is_reported_at_once(tmp_path):
    raw = tiny_config(tmp_path)
    raw["protocols"][1]["datasets"] = ["tex", "nope"]
    raw["protocols"][2]["name"] = "knn20"  # repeats protocols[0]
    raw["correlation"]["settings"][0]["protocol"] = "missing"
    raw["reference"]["scores"]["r18a"] = 76.5
    raw["report"]["path"] = " "
    lines = _messages(raw)
    assert [line.split(":")[0] for line in lines] == [
        "config.report.path", "config.protocols[2].name", "config.protocols[1].datasets[1]",
        "config.correlation.settings[0].protocol", "config.reference.scores.r18a"], lines


def test_the_plan_check_reports_every_registry_mistake_at_once(tmp_path):
    raw = tiny_config(tmp_path)
    raw["encoders"][0]["arch"] = "resnt18"
    raw["encoders"][2]["layers"] = ["pre_logits", "block99"]
    raw["datasets"][0]["test_split"] = "tst"
    raw["protocols"][0]["layers"] = ["block7"]
    with pytest.raises(ConfigError) as info:
        make_plan(load_config(raw))
    heads = [line.split(":")[0] for line in str(info.value).splitlines()]
    assert heads == ["config.protocols[0].layers", "config.datasets[0]", "config.encoders[0]", "config.encoders[2]"]
    assert not (tmp_path / "store").exists()


def test_repeval_run_prints_one_line_per_mistake_and_exits_2(tmp_path, capsys):
    raw = tiny_config(tmp_path)
    raw["encoders"][0]["seed"] = "zero"
    raw["encoders"][1]["seed"] = "one"
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["repeval: error: config.encoders[0].seed: expected int, got str 'zero'",
                   "repeval: error: config.encoders[1].seed: expected int, got str 'one'"]
    assert not (tmp_path / "store").exists()


def test_the_collector_keeps_one_mistake_as_it_was_and_lists_many():
    one = Mistakes()
    with one.collect():
        raise ConfigError("config.a: wrong")
    with pytest.raises(ConfigError) as info:
        one.raise_any()
    assert type(info.value) is ConfigError and str(info.value) == "config.a: wrong"
    many = Mistakes()
    for i in range(60):
        with many.collect():
            raise ConfigError(f"config.x[{i}]: wrong")
    with many.collect():
        raise ConfigMistakes(["config.x[0]: wrong", "config.y: also"])  # nested checks: merged, once each
    with pytest.raises(ConfigMistakes) as info:
        many.raise_any()
    assert len(info.value.messages) == 61 and info.value.messages[-1] == "config.y: also"
    lines = str(info.value).splitlines()
    assert len(lines) == 51 and lines[-1] == "... and 11 more mistake(s)"
    Mistakes().raise_any()  # nothing noted: nothing raised


def _bomb(levels: int = 6) -> str:
    """YAML whose anchor ``l{levels}`` stands for 10**levels strings, in a few hundred bytes."""
    lines = ["l0: &l0 x"]
    for k in range(1, levels + 1):
        lines.append(f"l{k}: &l{k} [{', '.join([f'*l{k - 1}'] * 10)}]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("where", ["encoder name", "storage_options"])
def test_an_alias_bomb_is_refused_with_one_short_line(tmp_path, capsys, where):
    raw = tiny_config(tmp_path)
    text = _bomb() + yaml.safe_dump(raw)
    if where == "encoder name":
        text = text.replace("name: r18a", "name: *l6")
    else:
        text = text.replace("store: ", "storage_options: {anon: *l6}\nstore: ", 1)
    path = tmp_path / "config.yaml"
    path.write_text(text)
    assert len(text) < 4000 and main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 300, err
    assert f"holds more than {MAX_VALUES:,} values" in err and err.startswith("repeval: error: config")
    assert not (tmp_path / "store").exists()


def test_a_huge_value_or_file_is_refused_and_quoted_values_are_cut(tmp_path):
    raw = tiny_config(tmp_path)
    long = copy.deepcopy(raw)
    long["storage_options"] = {"endpoint": "h" * (MAX_STRING + 1)}
    [line] = _messages(long)
    assert line.startswith(f"config.storage_options.endpoint: a string of {MAX_STRING + 1:,} characters ('hhh")
    assert len(line) < 200
    wrong = copy.deepcopy(raw)
    wrong["encoders"][0]["name"] = ["r18a"] * 500  # within the bounds, but not a name
    [line] = _messages(wrong)
    assert line.startswith("config.encoders[0].name: expected str, got list ['r18a', ") and len(line) < 150
    big = tmp_path / "big.yaml"
    big.write_text(yaml.safe_dump(raw) + "#" * MAX_FILE_BYTES)
    with pytest.raises(ConfigError, match=r"big.yaml: 1,0\d\d,\d\d\d bytes; a config file holds at most"):
        load_config(big)


def test_a_long_value_quoted_by_a_check_is_cut_on_the_terminal(tmp_path, capsys):
    raw = tiny_config(tmp_path)
    raw["encoders"][0]["source"] = "s" * MAX_STRING  # within the bounds; its check quotes it whole
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["run", str(path)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("repeval: error: config.encoders[0].source: 'sss") and line.endswith("...")
    assert len(line) <= 1000 + len("repeval: error: ")


def test_an_encoder_entry_converts_to_its_spec_field_by_field():
    """EncoderConfig declares every EncoderSpec field (the config's defaults are the spec's),
    and ``spec()`` carries each one over: the one conversion between the two types."""
    spec_fields = {f.name: f for f in dataclasses.fields(EncoderSpec)}
    config_fields = {f.name: f for f in dataclasses.fields(EncoderConfig)}
    assert set(spec_fields) <= set(config_fields)
    for name, f in spec_fields.items():
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            continue
        c = config_fields[name]
        default = c.default_factory() if c.default is dataclasses.MISSING else c.default
        assert to_plain(default) == to_plain(f.default), name
    entry = EncoderConfig(name="a", arch="resnet18", weights="random", seed=3, layers=["block1", "pre_logits"],
                          input_size=32, strip_prefixes=["net."], checkpoint_key="teacher", dtype="float16")
    assert to_plain(entry.spec()) == {name: to_plain(getattr(entry, name)) for name in spec_fields}

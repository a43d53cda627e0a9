"""Hostile config files are refused while they are parsed, naming the line and column (issue 30).

A merge-key bomb (a 4,000-key mapping merged 20,000 times, 300 KB) took 69 s and 2.75 GB
before its size was checked; 1,000 nested ``[`` ended in a RecursionError (exit 4). Both,
and every budget of jobs/config/load.py, are refused in milliseconds with a config
message; a config with anchors and merge keys under the budgets loads as PyYAML reads it.
"""

from __future__ import annotations

import re

import pytest
import yaml

from flows.cli.main import main
from jobs.config import load_config
from jobs.config.load import MAX_ALIASES, MAX_DEPTH, load_yaml
from jobs.config.mistakes import MAX_VALUES
from pipeline.errors import ConfigError
from tests.helpers.configs import tiny_config
from tests.helpers.cost import MB, measured

CPU_S = 5.0  # generous: each case takes milliseconds
PEAK = 100 * MB  # the bound for any config under 1 MB


def _merge_bomb(keys: int = 4000, merges: int = 20_000) -> str:
    base = "base: &b {" + ", ".join(f"k{i}: {i}" for i in range(keys)) + "}\n"
    return base + "items:\n" + "".join("  - {<<: *b}\n" for _ in range(merges))


def test_a_merge_key_bomb_is_refused_while_parsed_naming_where(tmp_path, capsys):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path)) + _merge_bomb())
    assert path.stat().st_size < 1 * MB
    with measured() as cost, pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert f"holds more than {MAX_VALUES:,} values" in message and "merge key" in message
    line = int(re.search(r", line (\d+), column \d+: ", message).group(1))
    assert path.read_text().splitlines()[line - 1] == "  - {<<: *b}"  # a merge, among the first few
    assert line < len(yaml.safe_dump(tiny_config(tmp_path)).splitlines()) + 10
    assert cost.cpu < CPU_S and cost.peak < PEAK, cost
    assert main(["run", str(path)]) == 2
    assert capsys.readouterr().err.startswith("repeval: error: config: ")


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 1000])
def test_deeply_nested_brackets_are_a_config_message_not_a_recursion_error(tmp_path, capsys, levels):
    raw = tiny_config(tmp_path)
    path = tmp_path / "config.yaml"
    text = yaml.safe_dump(raw).replace("n_way: 4", "n_way: " + "[" * levels + "]" * levels, 1)
    assert text.count("[") == levels
    path.write_text(text)
    with measured() as cost, pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "[[[" in t)
    assert f"line {line}, column" in message and ("nesting depth" in message or "levels deep" in message)
    assert cost.cpu < CPU_S and cost.peak < PEAK, cost
    assert main(["run", str(path)]) == 2  # a config error, not exit 4
    [err] = capsys.readouterr().err.splitlines()
    assert "line" in err and "Recursion" not in err


@pytest.mark.parametrize("case", ["self-alias", "aliases", "text"])
def test_each_yaml_budget_is_refused_with_its_place(case):
    if case == "self-alias":
        text, expected = "a: &a [1, *a]\n", "alias *'a' is inside the value it names"
    elif case == "aliases":
        text = "x: &x 1\nl: [" + ", ".join(["*x"] * (MAX_ALIASES + 1)) + "]\n"
        expected = f"more than {MAX_ALIASES:,} aliases"
    else:  # 5,000 characters repeated 100 times: 500,000 characters of text
        text = "s: &s " + "t" * 4000 + "\nl: [" + ", ".join(["*s"] * 100) + "]\n"
        expected = "the config's text passes"
    with pytest.raises(ConfigError) as info:
        load_yaml(text, "c.yaml")
    assert str(info.value).startswith("config: c.yaml, line ") and expected in str(info.value), str(info.value)


def test_anchors_and_merge_keys_under_the_budget_load_as_pyyaml_reads_them(tmp_path):
    text = ("defaults: &d {arch: resnet18, input_size: 32}\n"
            "encoders:\n  - {<<: *d, name: a, seed: 0}\n  - {<<: *d, name: b, seed: 1}\n"
            "layers: &l [pre_logits]\nmore: *l\n")
    assert load_yaml(text, "c.yaml") == yaml.safe_load(text)
    with pytest.raises(ConfigError, match=r"c.yaml: not valid YAML at line 2, column \d+: "):
        load_yaml("a: [1\nb: 2\n", "c.yaml")
    with pytest.raises(ConfigError, match="could not determine a constructor"):  # no tag builds an object
        load_yaml("a: !!python/object/apply:os.system [echo]\n", "c.yaml")

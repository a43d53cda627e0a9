"""docs/ says what the code does: the documents agree with the registries and the parser.

Checked against the source of truth, so a new protocol, setting, adapter parameter,
config field or command fails here until its row is written, and the message says which
file, section and row:

* docs/protocols.md: a ``## <protocol>`` section per registered protocol (but one that documents
  itself in its entry, ``about`` and ``setting_help``, for the generated reference), with its
  capability flags, its metrics and a settings table with a row saying what each of the
  registry's settings means (defaults and valid values are in the generated
  docs/reference/protocols.md, which tests/code/test_reference_docs.py keeps current);
* docs/protocols.md, encoder protocols: a settings table with a row per setting;
* docs/datasets.md: a ``## <adapter>`` section per adapter whose parameter table is the
  constructor's signature, defaults included;
* docs/config.md: a table row for every field of the config's dataclasses (and of
  ``suite:``), defaults included;
* docs/cli.md: a ``## repeval <command>`` section per subcommand naming each option with
  the parser's default, and every exit code;
* docs/store.md: a layout row for every folder the store's keys are built under;
* README.md: a "Documentation" section linking every file of docs/ (docs/reference/ too);
* docs/scaleout.md: scale-out steps whose workers declare ``MEMORY`` and get the store's
  credentials.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
import typing

import pytest

from flows.cli.docs import TOP_LEVEL, config_sections
from tests.helpers.code import REPO
from tests.helpers.docs import DOCS, first_code, parse_value, same_value, sections, table_rows

# Sections of docs/datasets.md that describe all adapters rather than one.
DATASET_TOPICS = {"What every adapter declares", "Suites"}


def _flag(value: bool) -> str:
    return "yes" if value else "no"


# -- protocols ---------------------------------------------------------------------------------
def _protocols() -> list[str]:
    """The entries documented by hand in docs/protocols.md: every one but those that document
    themselves (``about``, ``setting_help``: the generated docs/reference/protocols.md holds them)."""
    from pipeline.protocols import get_protocol, list_protocols

    return [n for n in list_protocols() if not get_protocol(n).about]


def test_every_registered_protocol_has_a_section():
    documented = sections(DOCS / "protocols.md")
    missing = [name for name in _protocols() if name not in documented]
    assert not missing, (f"docs/protocols.md lacks a section for registered protocol(s) {missing}: add "
                         "'## <name>' with what it computes, its papers, its flags and its settings table")


def test_every_protocol_section_is_a_registered_protocol():
    from pipeline.protocols import list_protocols

    registered = set(list_protocols())
    strangers = [name for name in sections(DOCS / "protocols.md") if name not in registered]
    assert not strangers, f"docs/protocols.md documents protocol(s) {strangers} that are not registered"


@pytest.mark.parametrize("name", _protocols())
def test_protocol_section_matches_the_registry(name):
    """Its flags, and a row for every setting saying what it means; the defaults, choices and
    ranges are the generated reference's (tests/code/test_reference_docs.py)."""
    from pipeline.protocols import get_protocol

    proto = get_protocol(name)
    body = sections(DOCS / "protocols.md").get(name)
    if body is None:
        pytest.fail(f"docs/protocols.md has no '## {name}' section")
    problems = []
    flags = f"Streams train: {_flag(proto.streams_train)}. Multi-label: {_flag(proto.multilabel)}"
    if flags not in " ".join(body.split()):
        problems.append(f"the section must say '{flags}' (the registry's streams_train and multilabel)")
    if f"](reference/protocols.md#{name})" not in body:
        problems.append(f"the section must link its settings' defaults: [reference/protocols.md]"
                        f"(reference/protocols.md#{name})")
    rows = {first_code(r[0]): r for r in table_rows(body) if first_code(r[0])}
    for setting in proto.defaults:
        row = rows.get(setting)
        if row is None or len(row) < 2 or not row[-1]:
            problems.append(f"no row '| `{setting}` | meaning |' (its default and range: run "
                            "python -m flows.cli.docs)")
    extra = sorted(set(rows) - set(proto.defaults))
    if extra:
        problems.append(f"rows for settings the registry does not have: {extra}")
    assert not problems, f"docs/protocols.md, section '## {name}':\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("name", _protocols())
def test_protocol_section_names_its_metrics_and_primary_metric(name):
    from pipeline.protocols import get_protocol

    proto = get_protocol(name)
    body = " ".join(sections(DOCS / "protocols.md").get(name, "").split())
    problems = []
    if f"Primary metric: `{proto.primary_metric}`" not in body:
        problems.append(f"the section must say 'Primary metric: `{proto.primary_metric}`' (the registry's)")
    listed = re.search(r"Metrics: (.*?)\. Primary metric", body)
    named = set(re.findall(r"`([^`]+)`", listed.group(1))) if listed else set()
    if named != set(proto.metrics):
        problems.append(f"its 'Metrics: ...' line names {sorted(named)}, the registry {sorted(proto.metrics)}")
    unbounded = re.search(r"Unbounded: (.*?)\.", body)
    if set(re.findall(r"`([^`]+)`", unbounded.group(1)) if unbounded else []) != set(proto.unbounded):
        problems.append(f"its 'Unbounded: ...' must name exactly {sorted(proto.unbounded) or 'nothing (no line)'}")
    assert not problems, f"docs/protocols.md, section '## {name}':\n  " + "\n  ".join(problems)


def test_every_fit_warning_code_is_documented_with_its_severity():
    from pipeline.protocols import get_protocol, list_protocols
    from pipeline.protocols.fit_warnings import WARNING_CODES

    own = {c for n in list_protocols() for c in get_protocol(n).warning_codes}  # in the generated reference
    WARNING_CODES = {c: v for c, v in WARNING_CODES.items() if c not in own}
    table = sections(DOCS / "protocols.md", level=3).get("Fit warnings", "")
    rows = {first_code(r[0]): r for r in table_rows(table) if first_code(r[0])}
    problems = [f"no row '| `{code}` | {severity} | ... |'" for code, (severity, _) in WARNING_CODES.items()
                if code not in rows or rows[code][1] != severity]
    problems += [f"a row for code {code!r}, which does not exist" for code in set(rows) - set(WARNING_CODES)]
    assert not problems, "docs/protocols.md, 'Fit warnings':\n  " + "\n  ".join(problems)


# -- encoder protocols ---------------------------------------------------------------------------
# Where each encoder protocol's settings table is: (file in docs/, start of its section's heading).
ENCODER_PROTOCOL_TABLES = {"finetune": ("protocols.md", "finetune"),
                           "saliency": ("protocols.md", "saliency"),
                           "colour_detail": ("protocols.md", "colour_detail")}


def _encoder_protocols() -> list[str]:
    from pipeline.protocols import get_protocol, list_protocols

    return [n for n in list_protocols() if get_protocol(n).reads == "weights"]


def test_every_encoder_protocol_has_a_settings_table():
    missing = [n for n in _encoder_protocols() if n not in ENCODER_PROTOCOL_TABLES]
    assert not missing, (f"encoder protocol(s) {missing} have no documented settings table: write one in docs/ "
                         "and name it in ENCODER_PROTOCOL_TABLES")


@pytest.mark.parametrize("name", _encoder_protocols())
def test_encoder_protocol_table_matches_the_registry(name):
    """A row per setting with its valid values (its settings class checks them, so the registry
    cannot say them) and meaning; the defaults are the generated reference's."""
    from pipeline.protocols import get_protocol

    file, heading = ENCODER_PROTOCOL_TABLES[name]
    body = next((b for h, b in sections(DOCS / file).items() if h.startswith(heading)), None)
    assert body is not None, f"docs/{file} has no section starting '## {heading}' for encoder protocol {name}"
    rows = {first_code(r[0]): r for r in table_rows(body) if first_code(r[0])}
    fields = get_protocol(name).defaults
    problems = [f"no row '| `{k}` | valid values | meaning |'" for k in fields if k not in rows or len(rows[k]) < 3]
    extra = sorted(set(rows) - set(fields))
    if extra:
        problems.append(f"rows for settings the registry does not have: {extra}")
    assert not problems, f"docs/{file}, section '## {heading}...' ({name}):\n  " + "\n  ".join(problems)


# -- dataset adapters ----------------------------------------------------------------------------
def _adapters() -> list[str]:
    from pipeline.datasets import list_datasets

    return list_datasets()


def test_every_adapter_has_a_section_and_every_section_an_adapter():
    documented = set(sections(DOCS / "datasets.md"))
    missing = [a for a in _adapters() if a not in documented]
    strangers = sorted(documented - set(_adapters()) - DATASET_TOPICS)
    assert not missing, f"docs/datasets.md lacks '## <adapter>' sections for {missing}"
    assert not strangers, f"docs/datasets.md has sections {strangers} that are neither adapters nor topics"


@pytest.mark.parametrize("adapter", _adapters())
def test_adapter_parameters_match_the_constructor(adapter):
    from pipeline.datasets import adapter_class

    body = sections(DOCS / "datasets.md").get(adapter)
    if body is None:
        pytest.fail(f"docs/datasets.md has no '## {adapter}' section")
    rows = {first_code(r[0]): r for r in table_rows(body) if first_code(r[0])}
    params = {k: p for k, p in inspect.signature(adapter_class(adapter).__init__).parameters.items() if k != "self"}
    problems = []
    for key, param in params.items():
        row = rows.get(key)
        if row is None:
            problems.append(f"no row '| `{key}` | default | meaning |'"
                            + (" (the content_hash row: fingerprint contents instead of stat)"
                               if key == "content_hash" else ""))
            continue
        if param.default is inspect.Parameter.empty:
            if row[1] != "(required)":
                problems.append(f"`{key}` has no default: its default cell must be '(required)', not {row[1]!r}")
        elif param.default is not None and not same_value(parse_value(row[1], yaml_syntax=True), param.default):
            problems.append(f"`{key}`: documented default {row[1]!r}, constructor default {param.default!r}")
    extra = sorted(set(rows) - set(params))
    if extra:
        problems.append(f"rows for parameters the constructor does not take: {extra}")
    assert not problems, f"docs/datasets.md, section '## {adapter}':\n  " + "\n  ".join(problems)


# -- config --------------------------------------------------------------------------------------
def _config_sections() -> list[tuple[str, type]]:
    """(section heading, dataclass) for the config and every dataclass nested in it: the same
    walk as the generator of docs/reference/config.md."""
    return config_sections()


def _field_default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _suite_fields() -> list[str]:
    """The fields ``suite:`` takes, as its own error message lists them."""
    from jobs.config.suites import expand_suite
    from pipeline.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        expand_suite({"suite": {"not-a-field": 1}}, REPO)
    return re.search(r"valid fields: (.*)$", str(caught.value)).group(1).split(", ")


@pytest.mark.parametrize("heading, cls", _config_sections(), ids=lambda v: v if isinstance(v, str) else "")
def test_config_reference_lists_every_field(heading, cls):
    body = sections(DOCS / "config.md").get(heading)
    if body is None:
        pytest.fail(f"docs/config.md lacks a '## {heading}' section for {cls.__name__}")
    rows = {first_code(r[0]): r for r in table_rows(body) if first_code(r[0])}
    problems = []
    for f in dataclasses.fields(cls):
        default = _field_default(f)
        row = rows.get(f.name)
        if row is None:
            problems.append(f"no row '| `{f.name}` | default | meaning |' ({cls.__name__}.{f.name})")
        elif default is dataclasses.MISSING:
            if row[1] != "(required)":
                problems.append(f"`{f.name}` is required: its default cell must be '(required)', not {row[1]!r}")
        elif default is not None and not dataclasses.is_dataclass(default) and \
                not same_value(parse_value(row[1], yaml_syntax=True), default):
            problems.append(f"`{f.name}`: documented default {row[1]!r}, real default {default!r}")
    extra = sorted(set(rows) - {f.name for f in dataclasses.fields(cls)} - ({"suite"} if heading == TOP_LEVEL else set()))
    if extra:
        problems.append(f"rows for fields {cls.__name__} does not have: {extra}")
    assert not problems, f"docs/config.md, section '## {heading}':\n  " + "\n  ".join(problems)


def test_config_reference_lists_the_suite_fields():
    rows = {first_code(r[0]) for r in table_rows(sections(DOCS / "config.md")["suite"])}
    missing = [f for f in _suite_fields() if f not in rows]
    assert not missing, f"docs/config.md, section '## suite': no rows for {missing}"


def test_config_reference_says_how_paths_layers_and_checkpoint_names_work():
    text = " ".join((DOCS / "config.md").read_text(encoding="utf-8").split())
    for phrase in ("Relative paths resolve against the config file's folder", "every layer each encoder extracts",
                   "<name_prefix><file name without its checkpoint extension>", "settle_seconds", "done_suffix"):
        assert phrase in text, f"docs/config.md no longer explains {phrase!r}"


# -- store layout ----------------------------------------------------------------------------------
def test_store_layout_lists_every_folder_of_the_store():
    """Each top-level folder that storage_schema/keys.py builds keys under has a row."""
    tree = ast.parse((REPO / "storage_schema" / "keys.py").read_text())
    values = {n.targets[0].id: n.value for n in tree.body if isinstance(n, ast.Assign)
              and isinstance(n.targets[0], ast.Name) and n.targets[0].id.lstrip("_").isupper()}
    side = ast.literal_eval(values["SIDE"])
    folders = {ast.literal_eval(values[k]) for k in ("FEATURES", "DATASETS")}
    folders |= {side + ast.unparse(v).split("{SIDE}", 1)[1].rstrip("'\"") for v in values.values()
                if isinstance(v, ast.JoinedStr) and "{SIDE}/" in ast.unparse(v)}
    documented = {first_code(r[0]) or "" for r in table_rows(sections(DOCS / "store.md")["Layout"])}
    missing = sorted(f for f in folders if not any(d.startswith(f + "/") for d in documented))
    assert not missing, f"docs/store.md, section '## Layout': no row for keys under {missing}"


# -- command line --------------------------------------------------------------------------------
def _commands(parser: argparse.ArgumentParser, prefix: str = "repeval") -> list[tuple[str, argparse.ArgumentParser]]:
    out = []
    for action in parser._actions:  # noqa: SLF001  argparse has no public walk of subcommands
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sub in action.choices.items():
                out.append((f"{prefix} {name}", sub))
                out += _commands(sub, f"{prefix} {name}")
    return out


def _cli_commands() -> list[tuple[str, argparse.ArgumentParser]]:
    from flows.cli.main import build_parser

    return _commands(build_parser())


def test_every_command_has_a_section_and_every_section_a_command():
    documented = {h for h in sections(DOCS / "cli.md") if h.startswith("repeval ")}
    commands = {name for name, _ in _cli_commands()}
    assert not sorted(commands - documented), f"docs/cli.md lacks '## <command>' sections for {sorted(commands - documented)}"
    assert not sorted(documented - commands), f"docs/cli.md documents commands that do not exist: {sorted(documented - commands)}"


def _documented_default_problem(action: argparse.Action, cell: str) -> str | None:
    """Why a default cell disagrees with the parser (None when it agrees)."""
    positional_required = not action.option_strings and action.nargs not in ("?", "*")
    if action.required or positional_required:
        return None if cell == "(required)" else f"required: its default cell must be '(required)', not {cell!r}"
    if isinstance(action, argparse._StoreTrueAction):  # noqa: SLF001
        return None if cell == "off" else f"a flag: its default cell must be 'off', not {cell!r}"
    default = action.default
    if isinstance(default, list) and len(default) == 1:
        default = default[0]
    if isinstance(default, (str, int, float)) and not isinstance(default, bool):
        written = first_code(cell)
        if written is None or not same_value(parse_value(written), default):
            return f"documented default {cell!r}, parser default {action.default!r}"
    return None


@pytest.mark.parametrize("command, parser", _cli_commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_command_section_names_every_option_with_its_default(command, parser):
    body = sections(DOCS / "cli.md").get(command, "")
    rows = {first_code(r[0]): r for r in table_rows(body)}
    missing, wrong = [], []
    for action in parser._actions:  # noqa: SLF001
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):  # noqa: SLF001
            continue
        name = next((o for o in action.option_strings if o.startswith("--")), None) or action.dest.upper()
        if name not in rows:
            missing.append(name)
        elif (problem := _documented_default_problem(action, rows[name][1])) is not None:
            wrong.append(f"`{name}`: {problem}")
    assert not missing, (f"docs/cli.md, section '## {command}': no option rows for {missing} "
                         "(add '| `--option` | default | meaning |')")
    assert not wrong, f"docs/cli.md, section '## {command}':\n  " + "\n  ".join(wrong)


def test_every_exit_code_is_documented():
    import flows.cli.main
    import flows.cli.run
    import flows.cli.store

    codes = {0} | {v for m in (flows.cli.main, flows.cli.run, flows.cli.store) for k, v in vars(m).items()
                   if k.startswith("EXIT_") and isinstance(v, int)}
    documented = {int(r[0]) for r in table_rows(sections(DOCS / "cli.md")["Exit codes"]) if r[0].isdigit()}
    assert codes <= documented, f"docs/cli.md, section '## Exit codes': no rows for {sorted(codes - documented)}"


# -- README ----------------------------------------------------------------------------------------
def test_readme_points_to_every_document():
    body = sections(REPO / "README.md").get("Documentation", "")
    missing = [str(p.relative_to(REPO)) for p in sorted(DOCS.rglob("*.md"))
               if f"({p.relative_to(REPO)})" not in body]
    assert not missing, f"README.md's '## Documentation' section does not link {missing}"


def test_scale_out_says_what_workers_need():
    """The scale-out steps as a lab follows them (docs/scaleout.md): workers that declare
    ``MEMORY`` (else every run warns), ``repeval run`` on the server ``PREFECT_API_URL``
    names, and the object store's credentials on every worker too."""
    body = " ".join((DOCS / "scaleout.md").read_text(encoding="utf-8").split())
    workers = [c for doc in (DOCS / "scaleout.md", DOCS / "scale.md")
               for block in re.findall(r"```bash\n(.*?)```", doc.read_text(encoding="utf-8"), re.S)
               for c in block.replace("\\\n", " ").splitlines() if re.search(r"\bdask worker\b", c)]
    assert workers and all(re.search(r'--resources "?[^ ]*MEMORY=', w) for w in workers), workers
    assert "`repeval run` reports there too" in body
    assert "each Dask worker" in body and "each Prefect worker" in body and "no credentials for the object store" in body


# -- the checks themselves -------------------------------------------------------------------------
def test_the_helpers_read_values_and_tables_as_written():
    assert parse_value("`1e-4`") == 1e-4 and parse_value("0.07") == 0.07 and parse_value("`l2`") == "l2"
    assert parse_value("[0.0, 1e-4]") == [0.0, 1e-4] and parse_value("true") is True
    assert parse_value("`[pre_logits]`", yaml_syntax=True) == ["pre_logits"]
    assert parse_value("`{train: 200, test: 100}`", yaml_syntax=True) == {"train": 200, "test": 100}
    assert same_value([1, "all"], (1, "all")) and not same_value(1, True) and same_value(1, 1.0)
    assert table_rows("| a | b |\n|---|---|\n| `x|y` | 2 |\n\ntext") == [["`x|y`", "2"]]

"""Bad benchmark configs: each is refused by load_config + check_plan (what run_benchmark
does before any work) with a ConfigError naming the field's path, and nothing is written."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.config import load_config
from jobs.run.plan import check_plan
from tests.helpers.names import bad_names


def base_config(root: Path) -> dict:
    return {
        "store": str(root / "store"),
        "encoders": [{"name": "r18", "arch": "resnet18", "input_size": 32, "layers": ["pre_logits", "block3"]}],
        "datasets": [{"name": "tex", "adapter": "textures", "params": {"n_per_class": {"train": 4, "test": 2}}}],
        "protocols": [{"name": "knn5", "protocol": "knn", "settings": {"n_neighbors": 5}},
                      {"name": "few", "protocol": "fewshot", "settings": {"n_way": 2, "n_shot": 1}}],
        "extract": {"batch_size": 8},
        "dask": {"n_workers": 1},
        "reference": {"scores": {"r18": 0.5}},
        "correlation": {"settings": [{"name": "c", "protocol": "knn5", "datasets": ["tex"]}], "bootstrap": 10},
        "report": {"path": str(root / "report.html")},
    }


# (path, what the field accepts): the bad value is drawn from the other types.
FIELDS = [
    (("store",), "str"), (("storage_options",), "dict"),
    (("encoders",), "list"), (("encoders", 0), "dict"),
    (("encoders", 0, "name"), "str"), (("encoders", 0, "arch"), "str"), (("encoders", 0, "weights"), "str"),
    (("encoders", 0, "seed"), "int"), (("encoders", 0, "layers"), "list"), (("encoders", 0, "layers", 0), "str"),
    (("encoders", 0, "input_size"), "int?"), (("encoders", 0, "strip_prefixes"), "list"),
    (("datasets", 0, "name"), "str"), (("datasets", 0, "adapter"), "str"), (("datasets", 0, "params"), "dict"),
    (("datasets", 0, "train_split"), "str"), (("datasets", 0, "val_split"), "str?"),
    (("protocols", 0, "name"), "str"), (("protocols", 0, "protocol"), "str"),
    (("protocols", 0, "settings"), "dict"), (("protocols", 0, "layers"), "list?"),
    (("protocols", 0, "datasets"), "list?"),
    (("dask",), "dict"), (("dask", "n_workers"), "int"), (("dask", "processes"), "bool"),
    (("dask", "gpu"), "str"), (("dask", "address"), "str?"),
    (("extract", "batch_size"), "int"), (("extract", "chunk_batches"), "int"), (("extract", "dtype"), "str"),
    (("extract", "lease_ttl"), "float"), (("extract", "device"), "str?"),
    (("reference", "scores"), "dict"), (("reference", "scores", "r18"), "float"), (("reference", "csv"), "str?"),
    (("correlation", "bootstrap"), "int"), (("correlation", "settings", 0, "datasets"), "list"),
    (("correlation", "settings", 0, "bounded"), "bool"), (("report", "path"), "str"),
]
SECTIONS = [(), ("encoders", 0), ("datasets", 0), ("protocols", 0), ("dask",), ("extract",), ("reference",),
            ("correlation",), ("correlation", "settings", 0), ("report",)]

VALUES = {
    "str": st.text(max_size=8), "int": st.integers(-5, 5), "float": st.floats(-2, 2),
    "bool": st.booleans(), "list": st.lists(st.integers(0, 3), max_size=2),
    "dict": st.dictionaries(st.sampled_from(["a", "b"]), st.integers(0, 3), max_size=2), "none": st.none(),
}
ACCEPTS = {"str": {"str"}, "int": {"int"}, "float": {"int", "float"}, "bool": {"bool"}, "list": {"list"},
           "dict": {"dict"}, "int?": {"int", "none"}, "str?": {"str", "none"}, "list?": {"list", "none"}}


def dotted(path: tuple) -> str:
    out = "config"
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def set_at(cfg: dict, path: tuple, value) -> None:
    node = cfg
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value


@st.composite
def wrong_type(draw):
    path, accepts = draw(st.sampled_from(FIELDS))
    kind = draw(st.sampled_from(sorted(set(VALUES) - ACCEPTS[accepts])))
    value = draw(VALUES[kind])
    return "wrong type", path, value, [dotted(path)]


@st.composite
def unknown_key(draw):
    section = draw(st.sampled_from(SECTIONS))
    key = draw(st.text("abcdefxyz_", min_size=1, max_size=10).filter(
        lambda k: k not in {"store", "dask", "extract", "name", "seed", "csv", "path", "scores", "metric", "layer",
                            "bounded", "datasets", "protocol", "settings", "bootstrap", "baseline", "address",
                            "device", "dtype", "arch", "adapter", "params", "layers", "weights", "reference"}))
    return "unknown key", section + (key,), 1, [dotted(section + (key,))]


@st.composite
def bad_name(draw):
    path = draw(st.sampled_from([("encoders", 0, "name"), ("datasets", 0, "name"), ("protocols", 0, "name"),
                                 ("encoders", 0, "layers", 0), ("datasets", 0, "train_split")]))
    name = draw(bad_names)
    # check_plan names the dataset entry for a split that the adapter lacks
    where = dotted(path[:2]) if path[-1] == "train_split" else dotted(path)
    return "bad name", path, name, [where]


@st.composite
def unknown_registry_name(draw):
    path = draw(st.sampled_from([("encoders", 0, "arch"), ("datasets", 0, "adapter"), ("protocols", 0, "protocol"),
                                 ("dask", "gpu"), ("extract", "dtype")]))
    value = draw(st.text("abcdefgknrst0123456789_-", min_size=1, max_size=12).filter(
        lambda v: v not in ("knn", "ridge", "textures", "digits", "features", "auto", "never", "always")))
    # the field's path, or its section's path followed by the field ("config.extract: dtype ...")
    return "unknown name", path, value, [dotted(path), f"{dotted(path[:-1])}: {path[-1]}",
                                         (f"{dotted(path[:-1])}: ", repr(value))]


@st.composite
def bad_protocol_setting(draw):
    proto = draw(st.sampled_from([0, 1]))
    where = ("protocols", proto, "settings")
    key, value = draw(st.one_of(
        st.tuples(st.text("abcxyz_", min_size=1, max_size=8), st.integers()),  # unknown setting
        st.tuples(st.just("n_neighbors" if proto == 0 else "n_way"),
                  st.text(max_size=3) | st.lists(st.integers(), max_size=2) | st.booleans()),  # wrong type
        st.tuples(st.just("metric" if proto == 0 else "pool"), st.text(max_size=6)),  # not a choice
        st.tuples(st.just("n_neighbors" if proto == 0 else "n_shot"), st.integers(-3, 0)),  # out of range
        st.tuples(st.just("temperature" if proto == 0 else "n_episodes"),
                  st.floats(max_value=0) if proto == 0 else st.integers(-3, 0)),
    ))
    if proto == 0 and key == "metric" and value in ("cosine", "euclidean"):
        value = value + "x"
    if proto == 1 and key == "pool" and value in ("all", "test"):
        value = value + "x"
    return "protocol setting", where + (key,), value, [dotted(("protocols", proto))]


# (path, value, what the message must name: the field, or the entry that the value breaks)
OUT_OF_RANGE = [
    (("extract", "batch_size"), 0, "config.extract"), (("extract", "chunk_batches"), -1, "config.extract"),
    (("extract", "num_workers"), -2, "config.extract"), (("extract", "lease_ttl"), 0.0, "config.extract"),
    (("extract", "lease_ttl"), -1.0, "config.extract"), (("extract", "lease_ttl"), float("nan"), "config.extract"),
    (("dask", "n_workers"), 0, "config.dask"), (("dask", "threads_per_worker"), -1, "config.dask"),
    (("dask", "math_threads"), 0, "config.dask.math_threads"), (("dask", "math_threads"), "all", "config.dask"),
    (("encoders", 0, "input_size"), 0, "config.encoders[0]"), (("encoders", 0, "input_size"), -32, "config.encoders[0]"),
    (("encoders", 0, "layers"), [], "config.encoders[0]"),
    (("encoders", 0, "layers"), ["pre_logits", "pre_logits"], "config.encoders[0]"),
    (("encoders", 0, "layers"), ["pre_logits", "block99"], "config.encoders[0]"),
    (("encoders", 0, "weights"), "/nonexistent/weights.safetensors", "config.encoders[0].weights"),
    (("encoders", 0, "weights"), "timm:", "config.encoders[0]"),
    (("encoders", 0, "weights"), "weights.ckpt", "config.encoders[0]"),
    (("correlation", "bootstrap"), -1, "config.correlation"),
    (("reference", "scores", "r18"), 76.5, "config.reference.scores.r18"),
    (("reference", "scores", "r18"), -0.1, "config.reference.scores.r18"),
    (("datasets", 0, "params"), {"n_per_class": {"train": 0, "test": 2}}, "config.datasets[0]"),
    (("datasets", 0, "params"), {"n_per_classes": 3}, "config.datasets[0]"),
    (("datasets", 0, "train_split"), "validation", "config.datasets[0]"),
    (("protocols", 0, "datasets"), ["nope"], "config.protocols[0].datasets[0]"),
    (("protocols", 0, "layers"), ["block2"], "config.protocols[0].layers"),
    (("encoders",), [], "config.encoders"),
    (("datasets",), [], "config.correlation.settings[0].datasets[0]"),
    (("protocols",), [], "config.correlation.settings[0].protocol"),
    (("store",), "", "config.store"), (("report", "path"), " ", "config.report.path"),
    (("store",), "s3://user:secret@bucket/store", "config.store"),
]


@st.composite
def out_of_range(draw):
    path, value, names = draw(st.sampled_from(OUT_OF_RANGE))
    return "out of range", path, value, [names]


mutations = st.one_of(wrong_type(), unknown_key(), bad_name(), unknown_registry_name(), bad_protocol_setting(),
                      out_of_range())


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("configs")


def test_base_config_is_valid(root):
    cfg = load_config(base_config(root))
    check_plan(cfg)
    assert not (root / "store").exists()


def _load_and_plan(raw: dict) -> None:
    check_plan(load_config(raw))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutation=mutations)
def test_bad_config_is_refused_naming_the_field(tally, root, mutation):
    kind, path, value, names = mutation
    raw = copy.deepcopy(base_config(root))
    set_at(raw, path, value)
    tally.expect_error("configs", lambda: _load_and_plan(raw), names, root, kind=kind)
    assert not (root / "store").exists()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.sampled_from(["store: \udcff\udcfe",  # bytes that are not UTF-8
                             "encoders: [", "- just\n- a list\n", "42", "", "encoders: !!python/object:os.system x",
                             "\x00\x01", "{a: 1, a: 2}", "store: [1, 2"]) | st.text(max_size=40))
def test_bad_yaml_file_is_refused_naming_the_file(tally, root, text):
    path = root / "bad config.yaml"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    tally.expect_error("config files", lambda: load_config(path), [str(path), "config"], root, kind="yaml")

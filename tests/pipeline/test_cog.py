"""ImageNet-CoG levels on a hand-made hierarchy whose numbers are worked out below.

The graph S (31 nodes; ``unicorn`` has no images and nothing with images below it, so it
is not in S). Images in brackets; * = seen (ImageNet-1K); descendant counts in S after
the colon (the node itself included):

entity: 31
  animal: 14
    dog [1000]: 6          terrier* [1300]: 3 (fox_terrier [900], rat_terrier [500]),
                           hound* [1300], puppy [1000]
    cat: 3                 tabby* [1300], lynx [800]
    bird: 4                parrot [1000]: 2 (macaw [1000]), owl [1000]
    unicorn (no images: outside S)
  artifact: 10
    vehicle: 4             car* [1300], bus [1000], amphibian [1000]
    vessel: 3              amphibian (a second parent), boat [1000]
    tool [900]: 3          hammer [1000], saw [1000, excluded]
  person: 2                athlete [1000]
  plant: 4                 tree [1000]: 2 (oak [1000]), flower [781]

artifact counts amphibian once: {artifact, vehicle, car, bus, amphibian, vessel, boat,
tool, hammer, saw} = 10. With L = log 31, IC(node with k below) = L - log k, and a leaf
has IC L. The seen concept with the smallest IC under each subsumer: terrier (L - log 3)
under dog, animal and entity; tabby (L) under cat; car (L) under vehicle and artifact.

Largest Lin similarity to a seen concept, eligible concepts:
  fox_terrier  LCS terrier with terrier:  2(L - log 3) / (2L - log 3)        = 0.8096
  lynx         LCS cat with tabby:        2(L - log 3) / 2L                   = 0.6801
  amphibian    LCS vehicle with car:      2(L - log 4) / 2L                   = 0.5963
               (through vessel the best subsumer would only be artifact: 0.3295)
  bus          LCS vehicle with car:      same                                = 0.5963
  puppy        LCS dog with terrier:      2(L - log 6) / (2L - log 3)         = 0.5693
               (with hound, also under dog, only (L - log 6) / L = 0.4782)
  boat, hammer LCS artifact with car:     2(L - log 10) / 2L                  = 0.3295
  macaw, owl   LCS animal with terrier:   2(L - log 14) / (2L - log 3)        = 0.2756
  oak          LCS entity (IC 0):                                             = 0
Not eligible: the seen four; dog (ancestor of seen); athlete (under person); saw
(excluded); rat_terrier (500) and flower (781) (fewer than 782 images); parrot, tool and
tree (ancestors of eligible macaw, hammer, oak).
Ranked (ties by id): fox_terrier, lynx, amphibian, bus, puppy, boat, hammer, macaw, owl, oak.
"""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
from PIL import Image

from pipeline.analysis.cog import (
    build_graph, cog_levels, eligible_concepts, information_content, level_blocks, lin_similarity,
    max_similarity_to_seen, sample_images,
)
from pipeline.analysis.cog_build import build_cog_levels, parse_counts, parse_is_a, parse_words
from pipeline.errors import ConfigError, DatasetError, DataValidationError

EDGES = [
    ("entity", "animal"), ("entity", "artifact"), ("entity", "person"), ("entity", "plant"),
    ("animal", "dog"), ("animal", "cat"), ("animal", "bird"), ("animal", "unicorn"),
    ("dog", "terrier"), ("dog", "hound"), ("dog", "puppy"), ("terrier", "fox_terrier"), ("terrier", "rat_terrier"),
    ("cat", "tabby"), ("cat", "lynx"), ("bird", "parrot"), ("bird", "owl"), ("parrot", "macaw"),
    ("artifact", "vehicle"), ("artifact", "vessel"), ("artifact", "tool"),
    ("vehicle", "car"), ("vehicle", "bus"), ("vehicle", "amphibian"), ("vessel", "amphibian"), ("vessel", "boat"),
    ("tool", "hammer"), ("tool", "saw"), ("person", "athlete"),
    ("plant", "tree"), ("plant", "flower"), ("tree", "oak"),
]
COUNTS = {
    "dog": 1000, "terrier": 1300, "hound": 1300, "puppy": 1000, "fox_terrier": 900, "rat_terrier": 500,
    "tabby": 1300, "lynx": 800, "parrot": 1000, "macaw": 1000, "owl": 1000, "car": 1300, "bus": 1000,
    "amphibian": 1000, "boat": 1000, "tool": 900, "hammer": 1000, "saw": 1000, "athlete": 1000,
    "tree": 1000, "oak": 1000, "flower": 781,
}
SEEN = ["terrier", "hound", "tabby", "car"]
EXCLUDED = ["saw"]
DESCENDANTS = {  # the hand count of S above; every other node is a leaf (1)
    "entity": 31, "animal": 14, "dog": 6, "terrier": 3, "cat": 3, "bird": 4, "parrot": 2, "artifact": 10,
    "vehicle": 4, "vessel": 3, "tool": 3, "person": 2, "plant": 4, "tree": 2,
}
L = math.log(31)
EXPECTED = {
    "fox_terrier": 2 * (L - math.log(3)) / (2 * L - math.log(3)),
    "lynx": (L - math.log(3)) / L,
    "amphibian": (L - math.log(4)) / L,
    "bus": (L - math.log(4)) / L,
    "puppy": 2 * (L - math.log(6)) / (2 * L - math.log(3)),
    "boat": (L - math.log(10)) / L,
    "hammer": (L - math.log(10)) / L,
    "macaw": 2 * (L - math.log(14)) / (2 * L - math.log(3)),
    "owl": 2 * (L - math.log(14)) / (2 * L - math.log(3)),
    "oak": 0.0,
}
NEAREST = {"fox_terrier": "terrier", "lynx": "tabby", "amphibian": "car", "bus": "car", "puppy": "terrier",
           "boat": "car", "hammer": "car", "macaw": "terrier", "owl": "terrier"}
RANKED = ["fox_terrier", "lynx", "amphibian", "bus", "puppy", "boat", "hammer", "macaw", "owl", "oak"]
OPTIONS = dict(root="entity", person="person")


def _ic(name):
    return L - math.log(DESCENDANTS.get(name, 1))


def _graph():
    return build_graph(EDGES, COUNTS, root="entity")


def test_subgraph_and_information_content():
    graph = _graph()
    assert len(graph.nodes) == 31 and "unicorn" not in graph.index
    ic = information_content(graph)
    for node in graph.nodes:
        assert ic[graph.index[node]] == pytest.approx(_ic(node), abs=1e-12)
    assert graph.ancestors_of("amphibian") == {"amphibian", "vehicle", "vessel", "artifact", "entity"}


def test_hand_worked_lin_similarities():
    graph = _graph()
    ic = information_content(graph)
    assert EXPECTED["fox_terrier"] == pytest.approx(0.8096, abs=1e-4)
    assert EXPECTED["macaw"] == pytest.approx(0.2756, abs=1e-4)
    cases = {("fox_terrier", "hound"): (L - math.log(6)) / L,  # LCS dog
             ("amphibian", "boat"): (L - math.log(3)) / L,  # LCS vessel, through the second parent
             ("amphibian", "car"): (L - math.log(4)) / L,  # LCS vehicle
             ("bus", "boat"): (L - math.log(10)) / L,  # LCS artifact
             ("oak", "car"): 0.0, ("lynx", "lynx"): 1.0}
    for (a, b), value in cases.items():
        assert lin_similarity(graph, ic, a, b) == pytest.approx(value, abs=1e-12)
        assert lin_similarity(graph, ic, b, a) == pytest.approx(value, abs=1e-12)


def test_max_similarity_to_seen_by_traversal_equals_all_pairs():
    graph = _graph()
    ic = information_content(graph)
    sim, nearest = max_similarity_to_seen(graph, ic, SEEN)
    for concept, value in EXPECTED.items():
        assert sim[graph.index[concept]] == pytest.approx(value, abs=1e-12), concept
    for concept, seen in NEAREST.items():
        assert graph.nodes[nearest[graph.index[concept]]] == seen, concept
    for node in graph.nodes:  # every node of S against the brute-force max over seen concepts
        brute = max(lin_similarity(graph, ic, node, s) for s in SEEN)
        assert sim[graph.index[node]] == pytest.approx(brute, abs=1e-12), node


def test_eligibility_rules():
    eligible, dropped = eligible_concepts(_graph(), COUNTS, SEEN, EXCLUDED, person="person")
    assert eligible == sorted(RANKED)
    assert dropped == {
        "terrier": "seen", "hound": "seen", "tabby": "seen", "car": "seen", "dog": "ancestor of a seen concept",
        "athlete": "under person", "saw": "excluded", "rat_terrier": "fewer than 782 images",
        "flower": "fewer than 782 images", "parrot": "ancestor of an eligible concept",
        "tool": "ancestor of an eligible concept", "tree": "ancestor of an eligible concept",
    }


@pytest.mark.parametrize("n_levels, size, expected", [
    (3, 2, [["fox_terrier", "lynx"], ["puppy", "boat"], ["owl", "oak"]]),  # starts 0, 4, 8
    (2, 3, [["fox_terrier", "lynx", "amphibian"], ["macaw", "owl", "oak"]]),  # starts 0, 7
    (4, 2, [["fox_terrier", "lynx"], ["bus", "puppy"], ["boat", "hammer"], ["owl", "oak"]]),  # 0, 3, 5, 8
    (1, 10, [RANKED]),
])
def test_levels_span_the_ranked_list(n_levels, size, expected):
    result = cog_levels(EDGES, COUNTS, SEEN, EXCLUDED, n_levels=n_levels, level_size=size, **OPTIONS)
    assert result.eligible == RANKED
    assert result.levels == expected
    summary = result.level_summary()
    assert summary[0]["similarity_max"] == pytest.approx(EXPECTED[expected[0][0]])
    assert summary[-1]["similarity_min"] == 0.0


def test_too_few_eligible_concepts_for_the_levels():
    with pytest.raises(DataValidationError, match="10 eligible concepts cannot fill 5 levels of 3"):
        cog_levels(EDGES, COUNTS, SEEN, EXCLUDED, n_levels=5, level_size=3, **OPTIONS)
    assert [list(b) for b in level_blocks(12, 3, 4)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


def test_bad_settings_fail_before_work(tmp_path):
    with pytest.raises(ConfigError, match="level_size must be an integer >= 1, got 0"):
        cog_levels(EDGES, COUNTS, SEEN, level_size=0, **OPTIONS)
    with pytest.raises(ConfigError, match="n_test must be an integer >= 1"):
        build_cog_levels(**_metadata(tmp_path), out_dir=tmp_path / "out", n_test=0, **OPTIONS)
    assert not (tmp_path / "out").exists()
    with pytest.raises(DataValidationError, match="person='nobody'"):
        cog_levels(EDGES, COUNTS, SEEN, root="entity", person="nobody", n_levels=1, level_size=2)


def test_graph_errors():
    with pytest.raises(DataValidationError, match="cycle"):
        build_graph(EDGES + [("fox_terrier", "dog")], COUNTS, root="entity")
    with pytest.raises(DataValidationError, match="no parent for stray"):
        build_graph(EDGES, {**COUNTS, "stray": 900}, root="entity")
    with pytest.raises(DataValidationError, match="seen concept"):
        cog_levels(EDGES, COUNTS, SEEN + ["nowhere"], **OPTIONS)


def test_image_draw_is_seeded_per_concept():
    files = [f"img{i:02d}.jpg" for i in range(20)]
    train, test = sample_images(files, "owl", seed=0, n_test=5, max_train=8)
    assert len(test) == 5 and len(train) == 8 and not set(train) & set(test)
    assert sample_images(list(reversed(files)), "owl", seed=0, n_test=5, max_train=8) == (train, test)
    assert sample_images(files, "owl", seed=1, n_test=5, max_train=8) != (train, test)
    assert sample_images(files, "oak", seed=0, n_test=5, max_train=8) != (train, test)
    all_train, _ = sample_images(files, "owl", seed=0, n_test=5, max_train=1300)
    assert len(all_train) == 15
    with pytest.raises(DataValidationError, match="has 5 images"):
        sample_images(files[:5], "owl", n_test=5)


def test_parsers():
    assert parse_is_a(["# comment\n", "a b\n", "\n"]) == [("a", "b")]
    assert parse_words(["n1\tdog, domestic dog\n"]) == {"n1": "dog, domestic dog"}
    assert parse_counts(["n1 12\n", "n2,3\n", "n3\t0\n"]) == {"n1": 12, "n2": 3, "n3": 0}
    with pytest.raises(DatasetError, match="counts:2: image count 'x'"):
        parse_counts(["n1 1", "n2 x"])
    with pytest.raises(DatasetError, match="is_a:1: expected 2 fields"):
        parse_is_a(["a b c"])


def _write(path, lines):
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def _metadata(tmp_path):
    meta = tmp_path / "meta"
    meta.mkdir(exist_ok=True)
    return dict(
        is_a=_write(meta / "wordnet.is_a.txt", [f"{p} {c}" for p, c in EDGES]),
        words=_write(meta / "words.txt", [f"{n}\t{n.replace('_', ' ')}" for n in DESCENDANTS | COUNTS]),
        counts=_write(meta / "counts.txt", [f"{n} {k}" for n, k in COUNTS.items()]),
        seen=_write(meta / "in1k.txt", SEEN),
        excluded=[_write(meta / "excluded.txt", ["# left out", *EXCLUDED])],
    )


def test_build_writes_manifests_readable_by_the_csv_adapter(tmp_path):
    from pipeline.datasets.adapters.folders import CsvManifestDataset

    images = tmp_path / "images"
    for concept in RANKED:
        (images / concept).mkdir(parents=True)
        for i in range(8):
            Image.new("RGB", (4, 4), (i * 30, 0, 0)).save(images / concept / f"{concept}_{i}.png")
        (images / concept / "notes.txt").write_text("not an image")
    out = tmp_path / "levels"
    result = build_cog_levels(**_metadata(tmp_path), out_dir=out, images_root=images, seed=0, n_test=2,
                              max_train=4, n_levels=3, level_size=2, **OPTIONS)
    assert result.levels == [["fox_terrier", "lynx"], ["puppy", "boat"], ["owl", "oak"]]
    for k, level in enumerate(result.levels, start=1):
        data = CsvManifestDataset(out / f"level_{k}.csv")
        assert data.class_names == sorted(level)
        assert sorted(data.splits) == ["test", "train"]
        np.testing.assert_array_equal(np.bincount(data.labels("train")), [4, 4])
        np.testing.assert_array_equal(np.bincount(data.labels("test")), [2, 2])
        assert not set(data.sample_ids("train")) & set(data.sample_ids("test"))
        assert data.load_image("test", 0).size == (4, 4)
    with open(out / "summary.csv", newline="") as fh:
        summary = list(csv.DictReader(fh))
    assert [row["level"] for row in summary] == ["1", "2", "3"]
    assert float(summary[0]["similarity_max"]) == pytest.approx(EXPECTED["fox_terrier"])
    assert float(summary[1]["similarity_min"]) == pytest.approx(EXPECTED["boat"])
    assert summary[2]["n_train_images"] == "8" and summary[2]["n_test_images"] == "4"
    with open(out / "concepts.csv", newline="") as fh:
        concepts = {row["concept"]: row for row in csv.DictReader(fh)}
    assert concepts["lynx"]["nearest_seen"] == "tabby" and concepts["lynx"]["words"] == "lynx"
    assert float(concepts["puppy"]["similarity"]) == pytest.approx(EXPECTED["puppy"], abs=1e-15)
    again = tmp_path / "again"
    build_cog_levels(**_metadata(tmp_path), out_dir=again, images_root=images, seed=0, n_test=2, max_train=4,
                     n_levels=3, level_size=2, **OPTIONS)
    assert (again / "level_2.csv").read_text() == (out / "level_2.csv").read_text()


def test_build_checks_every_folder_before_writing(tmp_path):
    images = tmp_path / "images"
    for concept in RANKED:
        (images / concept).mkdir(parents=True)
        for i in range(2 if concept == "oak" else 5):
            (images / concept / f"{i}.jpg").write_bytes(b"")
    out = tmp_path / "levels"
    with pytest.raises(DataValidationError, match="concept oak has 2 images"):
        build_cog_levels(**_metadata(tmp_path), out_dir=out, images_root=images, n_test=2, n_levels=3,
                         level_size=2, **OPTIONS)
    assert not out.exists()
    result = build_cog_levels(**_metadata(tmp_path), out_dir=out, n_levels=3, level_size=2, **OPTIONS)
    assert sorted(p.name for p in out.iterdir()) == ["concepts.csv", "summary.csv"]  # no images: no manifests
    assert result.summary[0]["n_concepts"] == 2

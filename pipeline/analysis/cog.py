"""ImageNet-CoG concept-generalisation levels (Sariyildiz et al. 2021) from ImageNet-21K metadata."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from pipeline.errors import ConfigError, DataValidationError

__all__ = [
    "ENTITY", "PERSON", "CogLevels", "ConceptGraph", "build_graph", "check_sizes", "cog_levels", "eligible_concepts",
    "information_content", "level_blocks", "lin_similarity", "max_similarity_to_seen", "sample_images",
]

ENTITY = "n00001740"  # WordNet's root synset
PERSON = "n00007846"  # person, individual, someone...
MIN_IMAGES = 782
N_LEVELS, LEVEL_SIZE = 5, 1000
N_TEST, MAX_TRAIN = 50, 1300


# ---------------------------------------------------------------- the graph and its similarity

@dataclass(frozen=True)
class ConceptGraph:
    """The subgraph S: nodes in topological order (every parent before its children)."""

    nodes: tuple[str, ...]
    index: dict[str, int]
    parents: tuple[tuple[int, ...], ...]
    ancestors: tuple[frozenset[int], ...]  # each node's ancestors, itself included
    root: int

    def ancestors_of(self, concept: str) -> set[str]:
        """Ids of the ancestors of ``concept``, itself included."""
        return {self.nodes[i] for i in self.ancestors[self.index[concept]]}


def build_graph(edges: Iterable[tuple[str, str]], concepts: Iterable[str], root: str = ENTITY) -> ConceptGraph:
    """The subgraph of ``concepts`` and all their ancestors, checked to be a DAG under ``root``."""
    parents_of: dict[str, list[str]] = {}
    for parent, child in edges:
        parents_of.setdefault(child, []).append(parent)
    keep, stack = set(), list(dict.fromkeys(concepts))
    while stack:  # everything above the concepts
        c = stack.pop()
        if c not in keep:
            keep.add(c)
            stack.extend(parents_of.get(c, ()))
    orphans = sorted(c for c in keep if c != root and not parents_of.get(c))
    if orphans or root not in keep:
        shown = ", ".join(orphans[:10]) + (f", ... ({len(orphans)} in all)" if len(orphans) > 10 else "")
        raise DataValidationError(f"the is_a pairs do not connect every concept to the root {root!r}: "
                                  f"{'no parent for ' + shown if orphans else root + ' is above no concept'}")
    # Kahn's algorithm over the kept nodes, ids sorted for a reproducible order
    children: dict[str, list[str]] = {}
    indegree = {c: 0 for c in keep}
    for child in keep:
        for parent in set(parents_of.get(child, ())):
            children.setdefault(parent, []).append(child)
            indegree[child] += 1
    order, ready = [], sorted(c for c, k in indegree.items() if k == 0)
    while ready:
        node = ready.pop()
        order.append(node)
        for child in sorted(children.get(node, ()), reverse=True):
            indegree[child] -= 1
            if indegree[child] == 0:
                ready.append(child)
    if len(order) != len(keep):
        stuck = sorted(c for c, k in indegree.items() if k > 0)
        raise DataValidationError(f"the is_a pairs contain a cycle through {', '.join(stuck[:10])}")
    index = {c: i for i, c in enumerate(order)}
    parents = tuple(tuple(sorted(index[p] for p in set(parents_of.get(c, ())))) for c in order)
    ancestors: list[frozenset[int]] = []
    for i, ps in enumerate(parents):  # parents come first in the order
        ancestors.append(frozenset({i}.union(*(ancestors[p] for p in ps))))
    return ConceptGraph(tuple(order), index, parents, tuple(ancestors), index[root])


def information_content(graph: ConceptGraph) -> np.ndarray:
    """Information content of every node."""
    below = np.zeros(len(graph.nodes))
    for anc in graph.ancestors:  # sum_c |desc(c)| = sum_u |anc(u)|
        below[list(anc)] += 1
    return -np.log(below / len(graph.nodes))


def lin_similarity(graph: ConceptGraph, ic: np.ndarray, a: str, b: str) -> float:
    """Lin similarity of two concepts, the common subsumer taken over all paths of the DAG."""
    i, j = graph.index[a], graph.index[b]
    if i == j:
        return 1.0
    lcs = max(graph.ancestors[i] & graph.ancestors[j], key=lambda k: ic[k])
    return float(2 * ic[lcs] / (ic[i] + ic[j]))


def max_similarity_to_seen(graph: ConceptGraph, ic: np.ndarray, seen: Iterable[str]) -> tuple[np.ndarray, np.ndarray]:
    """Every node's largest Lin similarity to a seen concept, and that concept (node index)."""
    # O(V + E + A) with A the total ancestor count; see the module docstring.
    seen_idx = [graph.index[s] for s in seen]
    min_ic, argmin = np.full(len(graph.nodes), np.inf), np.full(len(graph.nodes), -1)
    min_ic[seen_idx], argmin[seen_idx] = ic[seen_idx], seen_idx
    for i in range(len(graph.nodes) - 1, -1, -1):  # children before parents: min is order-free on a DAG
        for p in graph.parents[i]:
            if min_ic[i] < min_ic[p]:
                min_ic[p], argmin[p] = min_ic[i], argmin[i]
    sim, nearest = np.zeros(len(graph.nodes)), np.full(len(graph.nodes), -1)
    for u, anc in enumerate(graph.ancestors):
        a = np.array(sorted(anc))
        a = a[np.isfinite(min_ic[a])]
        if a.size == 0:  # no seen concept anywhere below the root
            continue
        values = 2 * ic[a] / (ic[u] + min_ic[a])  # the denominator is 0 only for a seen root
        best = int(np.argmax(values))
        sim[u], nearest[u] = values[best], argmin[a[best]]
    sim[seen_idx], nearest[seen_idx] = 1.0, seen_idx
    return sim, nearest


def eligible_concepts(graph: ConceptGraph, counts: Mapping[str, int], seen: Iterable[str],
                      excluded: Iterable[str] = (), person: str | None = PERSON,
                      min_images: int = MIN_IMAGES) -> tuple[list[str], dict[str, str]]:
    """The concepts that may enter a level, and why each other ImageNet-21K concept may not."""
    seen_set = set(seen)
    above_seen = set().union(*(graph.ancestors_of(s) for s in seen_set)) - seen_set
    p = graph.index.get(person) if person is not None else None
    excluded = set(excluded)
    candidates, dropped = [], {}
    for c in sorted(k for k, v in counts.items() if v > 0):
        i = graph.index[c]
        if c in seen_set:
            dropped[c] = "seen"
        elif c in above_seen:
            dropped[c] = "ancestor of a seen concept"
        elif p is not None and p in graph.ancestors[i]:
            dropped[c] = f"under {person}"
        elif c in excluded:
            dropped[c] = "excluded"
        elif counts[c] < min_images:
            dropped[c] = f"fewer than {min_images} images"
        else:
            candidates.append(i)
    has_candidate_below = set()
    for i in candidates:
        has_candidate_below.update(graph.ancestors[i] - {i})
    eligible = []
    for i in candidates:
        if i in has_candidate_below:
            dropped[graph.nodes[i]] = "ancestor of an eligible concept"
        else:
            eligible.append(graph.nodes[i])
    return eligible, dropped


# ---------------------------------------------------------------- levels and images

def check_sizes(**values: tuple[object, int]) -> None:
    """Refuse a count setting that is not an integer at least its minimum."""
    for name, (value, low) in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")


def level_blocks(n_ranked: int, n_levels: int = N_LEVELS, level_size: int = LEVEL_SIZE) -> list[range]:
    """Positions in the ranked list of each level, blocks spread evenly over the whole list."""
    if n_levels < 1 or level_size < 1:
        raise DataValidationError(f"n_levels and level_size must be >= 1, got {n_levels} and {level_size}")
    if n_ranked < n_levels * level_size:
        raise DataValidationError(f"{n_ranked} eligible concepts cannot fill {n_levels} levels of {level_size} "
                                  f"(needs {n_levels * level_size}); lower level_size or n_levels")
    starts = np.round(np.linspace(0, n_ranked - level_size, n_levels)).astype(int)
    return [range(s, s + level_size) for s in starts]


def sample_images(files: Sequence[str], concept: str, seed: int = 0, n_test: int = N_TEST,
                  max_train: int = MAX_TRAIN) -> tuple[list[str], list[str]]:
    """Draw one concept's test and training images."""
    if len(files) <= n_test:
        raise DataValidationError(f"concept {concept} has {len(files)} images; {n_test} test images and at least "
                                  "one training image are needed")
    key = int.from_bytes(hashlib.sha256(concept.encode()).digest()[:8], "little")
    order = np.random.default_rng([seed, key]).permutation(len(files))
    ordered = sorted(files)
    test = sorted(ordered[i] for i in order[:n_test])
    train = sorted(ordered[i] for i in order[n_test:n_test + max_train])
    return train, test


@dataclass(frozen=True)
class CogLevels:
    """The levels (concept ids, most similar first) and what they were built from."""

    levels: list[list[str]]
    similarity: dict[str, float]  # every ImageNet-21K concept's similarity to ImageNet-1K
    nearest_seen: dict[str, str | None]
    eligible: list[str]  # sorted by decreasing similarity
    dropped: dict[str, str]
    summary: list[dict[str, object]] = field(default_factory=list)

    def level_summary(self) -> list[dict[str, object]]:
        """Per level: its number, size, and the range and mean of its similarities."""
        rows = []
        for k, level in enumerate(self.levels, start=1):
            s = np.array([self.similarity[c] for c in level])
            rows.append({"level": k, "n_concepts": len(level), "similarity_max": float(s.max()),
                         "similarity_min": float(s.min()), "similarity_mean": float(s.mean()),
                         "first": level[0], "last": level[-1]})
        return rows


def cog_levels(edges: Iterable[tuple[str, str]], counts: Mapping[str, int], seen: Iterable[str],
               excluded: Iterable[str] = (), *, root: str = ENTITY, person: str | None = PERSON,
               min_images: int = MIN_IMAGES, n_levels: int = N_LEVELS, level_size: int = LEVEL_SIZE) -> CogLevels:
    """Rank the eligible unseen concepts by similarity to the seen ones and cut the levels."""
    check_sizes(min_images=(min_images, 0), n_levels=(n_levels, 1), level_size=(level_size, 1))
    concepts = [c for c, v in counts.items() if v > 0]
    seen = list(dict.fromkeys(seen))
    missing = [s for s in seen if counts.get(s, 0) <= 0]
    if missing:
        raise DataValidationError(f"{len(missing)} seen concept(s) have no images in the counts: "
                                  f"{', '.join(missing[:10])}; the seen list must be a subset of ImageNet-21K")
    graph = build_graph(edges, concepts, root)
    if person is not None and person not in graph.index:
        raise DataValidationError(f"person={person!r} is not in the graph of ImageNet-21K concepts and their "
                                  "ancestors; pass its id, or person=None to keep every subtree")
    ic = information_content(graph)
    sim, nearest = max_similarity_to_seen(graph, ic, seen)
    eligible, dropped = eligible_concepts(graph, counts, seen, excluded, person, min_images)
    ranked = sorted(eligible, key=lambda c: (-sim[graph.index[c]], c))
    levels = [[ranked[i] for i in block] for block in level_blocks(len(ranked), n_levels, level_size)]
    return CogLevels(
        levels=levels,
        similarity={c: float(sim[graph.index[c]]) for c in concepts},
        nearest_seen={c: graph.nodes[nearest[graph.index[c]]] if nearest[graph.index[c]] >= 0 else None
                      for c in concepts},
        eligible=ranked, dropped=dropped)

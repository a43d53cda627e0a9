"""The readouts of issue 15 against what a user would otherwise write, side by side.

* CoG similarity: ``max_similarity_to_seen`` (one bottom-up pass plus a walk over each
  concept's ancestors) against all-pairs Lin similarity (for each unseen concept, the
  LCS with every seen concept by ancestor-set intersection, the direct reading of the
  definition), on a synthetic WordNet-sized DAG (``--nodes`` nodes, 21K-like concept set,
  1,000 seen, ~5 % of nodes with a second parent). All-pairs is timed on a sample of
  unseen concepts and reported per concept; both sides' values are checked equal on it.
* MLP grid: ``MLPProbe``'s stacked grid (every weight decay in one batched pass) against a
  bare torch loop fitting the grid values one after another (nn.Sequential, torch AdamW,
  the same epochs and minibatches), one thread each, same work (fixed epochs, no early
  stopping on either side).
* Attentive pooling: ``attentive_logits`` (single-query shortcut, O(B T d H)) against
  torch.nn.MultiheadAttention + LayerNorm + Linear (projects every token, O(B T d^2)):
  forward + backward of one batch of ViT-B-sized tokens.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/bench_readouts.py [--quick]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch


def _paired(ours, reference, pairs: int) -> tuple[float, float, float]:
    """Median times of both sides and the median per-pair ratio reference / ours, run
    interleaved (ours, reference, reference, ours, ...) so drifting load hits both."""
    t_ours, t_ref = [], []
    for k in range(pairs):
        for side in ((ours, reference) if k % 2 == 0 else (reference, ours)):
            start = time.perf_counter()
            side()
            (t_ours if side is ours else t_ref).append(time.perf_counter() - start)
    ratios = [r / o for o, r in zip(t_ours, t_ref)]
    return statistics.median(t_ours), statistics.median(t_ref), statistics.median(ratios)


def _timed(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def synthetic_wordnet(n_nodes: int, seed: int = 0):
    """A random DAG shaped like WordNet's noun hierarchy: depth ~ 10-18, a few second parents."""
    rng = np.random.default_rng(seed)
    names = [f"n{i:08d}" for i in range(n_nodes)]
    depth = np.zeros(n_nodes, dtype=int)
    edges = []
    for i in range(1, n_nodes):
        # prefer recent, deeper parents so that depth grows like WordNet's
        parent = int(rng.integers(max(0, i - 2000), i)) if rng.random() < 0.9 else int(rng.integers(0, i))
        edges.append((names[parent], names[i]))
        depth[i] = depth[parent] + 1
        if rng.random() < 0.05:
            other = int(rng.integers(0, i))
            if other != parent:
                edges.append((names[other], names[i]))
    leaves = sorted(set(names) - {p for p, _ in edges})
    concepts = set(rng.choice(leaves, size=min(len(leaves), int(0.6 * n_nodes)), replace=False))
    concepts |= set(rng.choice(names[1:], size=n_nodes // 20, replace=False))
    counts = {c: int(rng.integers(100, 1500)) for c in sorted(concepts)}
    seen = list(rng.choice(sorted(concepts), size=1000, replace=False))
    return edges, counts, seen, names[0]


def bench_cog(n_nodes: int, sample: int) -> None:
    from pipeline.analysis.cog import build_graph, cog_levels, information_content, lin_similarity, max_similarity_to_seen

    edges, counts, seen, root = synthetic_wordnet(n_nodes)
    graph = build_graph(edges, [c for c, v in counts.items() if v > 0], root)
    ic = information_content(graph)
    ours, (sim, _) = _timed(lambda: max_similarity_to_seen(graph, ic, seen), 3)
    unseen = [c for c in counts if c not in set(seen)]
    picked = list(np.random.default_rng(1).choice(unseen, size=sample, replace=False))
    start = time.perf_counter()
    brute = [max(lin_similarity(graph, ic, u, s) for s in seen) for u in picked]
    brute_per = (time.perf_counter() - start) / sample
    exact = np.allclose(brute, [sim[graph.index[u]] for u in picked], rtol=0, atol=1e-12)
    ours_per = ours / len(graph.nodes)
    full, _ = _timed(lambda: cog_levels(edges, counts, seen, root=root, person=None, min_images=782,
                                        n_levels=5, level_size=200), 1)
    print(f"CoG: {len(graph.nodes)} nodes, {len(counts)} concepts, {len(seen)} seen, "
          f"{sum(len(a) for a in graph.ancestors)} ancestor entries")
    print(f"  traversal, every node:        {ours:8.3f} s  ({ours_per * 1e6:8.1f} us/concept)")
    print(f"  all-pairs LCS, {sample} sampled:  {brute_per * 1e6:8.1f} us/concept -> whole graph "
          f"~{brute_per * len(graph.nodes):.0f} s; ratio {brute_per / ours_per:.0f}x; same values: {exact}")
    print(f"  cog_levels end to end (parse-free): {full:.3f} s")


def bench_mlp(n: int, d: int, epochs: int) -> None:
    from pipeline.protocols.nets.mlp import DEFAULT_MLP_WEIGHT_DECAYS, StackedMLP
    from pipeline.protocols.nets.stacked_training import StackedAdamW, train_epoch

    rng = np.random.default_rng(0)
    X = torch.from_numpy(rng.standard_normal((n, d)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, 10, n))
    rows, cpu = np.arange(n), torch.device("cpu")
    wds = np.array(DEFAULT_MLP_WEIGHT_DECAYS)

    def stacked():
        # the grid run's training work: all members on the same minibatches
        gen = torch.Generator().manual_seed(0)
        model = StackedMLP(len(wds), d, 1000, 10, gen, cpu)
        opt = StackedAdamW(model.params, torch.full((len(wds),), 1e-3), torch.tensor(wds, dtype=torch.float32),
                           model.decayed)
        for _ in range(epochs):
            train_epoch(model, opt, X, y, rows, 256, gen, cpu)

    def sequential():
        for wd in wds:
            torch.manual_seed(0)
            net = torch.nn.Sequential(torch.nn.Linear(d, 1000), torch.nn.ReLU(), torch.nn.Linear(1000, 10))
            decay = [net[0].weight, net[2].weight]
            opt = torch.optim.AdamW([{"params": decay, "weight_decay": float(wd)},
                                     {"params": [net[0].bias, net[2].bias], "weight_decay": 0.0}], lr=1e-3)
            gen = torch.Generator().manual_seed(0)
            for _ in range(epochs):
                order = torch.randperm(n, generator=gen)
                for s in range(0, n, 256):
                    idx = order[s:s + 256]
                    loss = torch.nn.functional.cross_entropy(net(X[idx]), y[idx])
                    opt.zero_grad()
                    loss.backward()
                    opt.step()

    t_ours, t_ref, ratio = _paired(stacked, sequential, 4)
    print(f"MLP grid of {len(wds)} weight decays, n={n}, d={d}, 1,000 hidden, {epochs} epochs:")
    print(f"  stacked members: {t_ours:.3f} s   one fit per value (bare torch loop): {t_ref:.3f} s   "
          f"median pair ratio {ratio:.2f}x")


def bench_attentive(B: int, T: int, d: int, H: int) -> None:
    from pipeline.protocols.nets.attentive import StackedAttentive, attentive_logits

    X = torch.randn(B, T, d)
    model = StackedAttentive(1, d, 100, H, torch.Generator().manual_seed(0), torch.device("cpu"))
    mha = torch.nn.MultiheadAttention(d, H, batch_first=True)
    norm, head = torch.nn.LayerNorm(d), torch.nn.Linear(d, 100)
    query = torch.nn.Parameter(torch.randn(1, 1, d) * 0.02)

    def ours():
        attentive_logits(model.params, X, H).sum().backward()

    def reference():
        out, _ = mha(query.expand(B, 1, d), X, X, need_weights=False)
        head(norm(out[:, 0])).sum().backward()

    t_ours, t_ref, ratio = _paired(ours, reference, 6)
    print(f"Attentive pooling, batch {B} x {T} tokens x d={d}, {H} heads, forward + backward:")
    print(f"  single-query shortcut: {t_ours * 1e3:.1f} ms   nn.MultiheadAttention: {t_ref * 1e3:.1f} ms   "
          f"median pair ratio {ratio:.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", choices=("all", "mlp"), default="all")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.only in ("all", "mlp") and args.quick:
        bench_mlp(2000, 256, 2)
    if args.only in ("all", "mlp") and not args.quick:
        bench_mlp(10000, 768, 3)
    if args.only == "mlp":
        return
    if args.quick:
        bench_cog(8000, 50)
        bench_attentive(32, 197, 384, 6)
    else:
        bench_cog(32000, 200)
        bench_attentive(64, 197, 768, 12)


if __name__ == "__main__":
    main()

"""What storing features as float16 costs in accuracy, on the demo's datasets.

Each encoder is extracted once on ``digits`` and ``textures`` (train and test) in float32;
every protocol then runs on those features and on the same features rounded to float16
(what ``dtype: float16`` stores), side by side in one process. Printed: the score of
each (encoder, dataset, protocol) in both dtypes and the largest absolute difference.
Encoders: random-init resnet18 (stage 3 and pooled features) and ViT-Tiny at 64 px, as
in the demo's config (its trained checkpoints need the demo's source training).

Run: ``.venv/bin/python benchmarks/bench_float16.py [--markdown]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROTOCOLS = {"logistic": {}, "ridge": {}, "knn": {}, "fewshot": {"n_way": 4, "n_shot": 5}}
ENCODERS = [("resnet18", ("pre_logits", "block3")), ("vit_tiny_patch16_224", ("pre_logits",))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args()

    import numpy as np
    import torch

    from jobs.extraction.extract import ExtractConfig, extract
    from pipeline.datasets import make_dataset
    from pipeline.encoders import EncoderSpec
    from pipeline.protocols import EvalData, get_protocol
    from storage_schema import FeatureStore

    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        store = FeatureStore(os.path.join(tmp, "store"))
        for dataset in (make_dataset("digits", name="digits"), make_dataset("textures", name="textures")):
            for arch, layers in ENCODERS:
                spec = EncoderSpec(name=arch, arch=arch, layers=layers, input_size=64)
                for split in ("train", "test"):
                    extract(store, spec, dataset, split, ExtractConfig(batch_size=64, progress=False, device="cpu"))
                y_tr = store.labels(dataset.name, "train").read()
                y_te = store.labels(dataset.name, "test").read()
                K = int(max(y_tr.max(), y_te.max())) + 1
                for layer in layers:
                    X_tr = store.features(arch, dataset.name, "train", layer).read()
                    X_te = store.features(arch, dataset.name, "test", layer).read()
                    for name, settings in PROTOCOLS.items():
                        proto = get_protocol(name)
                        scores = []
                        for dtype in (np.float32, np.float16):
                            data = EvalData(X_train=X_tr.astype(dtype), y_train=y_tr, X_test=X_te.astype(dtype),
                                            y_test=y_te, n_classes=K)
                            scores.append(float(proto(data, settings).metrics["score"]))
                        rows.append((dataset.name, arch, layer, name, *scores))
    sep = " | " if args.markdown else "  "
    head = ["dataset", "encoder", "layer", "protocol", "float32", "float16", "difference (points)"]
    if args.markdown:
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    else:
        print(sep.join(head))
    for d, a, layer, n, s32, s16 in rows:
        cells = [d, a, layer, n, f"{100 * s32:.2f}", f"{100 * s16:.2f}", f"{100 * (s16 - s32):+.2f}"]
        print(("| " + sep.join(cells) + " |") if args.markdown else sep.join(cells))
    worst = max(abs(r[5] - r[4]) for r in rows)
    print(f"largest |float16 - float32| over {len(rows)} scores: {100 * worst:.2f} points")


if __name__ == "__main__":
    main()

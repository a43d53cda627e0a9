"""Small benchmark configs shared by the flow, schedule, cluster and server tests."""

from __future__ import annotations

import json
from pathlib import Path


def tiny_config(tmp: Path) -> dict:
    """3 encoders x 1 tiny textures dataset x 4 protocol settings (one failing per encoder)."""
    return {
        "store": str(tmp / "store"),
        "dask": {"n_workers": 2, "processes": True},
        "extract": {"batch_size": 32, "chunk_batches": 2},
        "encoders": [
            {"name": "r18a", "arch": "resnet18", "input_size": 32, "seed": 0},
            {"name": "r18b", "arch": "resnet18", "input_size": 32, "seed": 1},
            {"name": "mnv3", "arch": "mobilenetv3_small_050", "input_size": 32, "seed": 0},
        ],
        "datasets": [{"name": "tex", "adapter": "textures", "params": {"n_per_class": {"train": 40, "test": 20}}}],
        "protocols": [
            {"name": "knn20", "protocol": "knn"},
            {"name": "ridge", "protocol": "ridge"},
            {"name": "few", "protocol": "fewshot", "settings": {"n_way": 4, "n_shot": 5, "n_episodes": 50}},
            # tex has 4 classes: 5-way episodes are impossible, and each such cell fails alone
            {"name": "few5", "protocol": "fewshot", "settings": {"n_way": 5, "n_shot": 5, "n_episodes": 10}},
        ],
        "reference": {"scores": {"r18a": 0.3, "r18b": 0.5, "mnv3": 0.7, "r18c": 0.6}},
        "correlation": {"settings": [{"name": "knn", "protocol": "knn20", "datasets": ["tex"]}], "bootstrap": 200},
        "report": {"path": str(tmp / "report" / "report.html"), "baseline": "r18a"},
    }


def write_checkpoint(folder: Path, name: str, seed: int, score: float | None = None, arch: str = "resnet18") -> Path:
    """A real random-init timm checkpoint (safetensors) and, with ``score``, its sidecar."""
    import timm
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = timm.create_model(arch, pretrained=False, num_classes=0)
    path = folder / f"{name}.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    if score is not None:
        path.with_suffix(".json").write_text(json.dumps({"reference_score": score}))
    return path

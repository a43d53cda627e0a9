"""A zoo of checkpoints written the way training code writes them, with the model whose
forward pass the features must equal.

Each writer follows the layout of a well-known training script (not its code): MoCo v2's
``checkpoint_XXXX.pth.tar``, DINO's teacher/student file with its ``args``, a Lightning
``last.ckpt`` (and a ``.pth`` link to it), timm's train.py file with an EMA copy,
torchvision's reference-script file with its ``model_ema``, a BYOL
online/target pair, MAE's ``model`` with its decoder at 224 px evaluated at 64, and plain
timm, Hugging Face and torchvision state dicts. Tiny timm test models keep it fast.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import timm
import torch
from safetensors.torch import save_file
from torch import nn

RESNET = "test_resnet"  # resnet naming (conv1, layer1.., fc), 0.4 M parameters
VIT = "test_vit"  # ViT naming (patch_embed, pos_embed, blocks.., head), 0.3 M parameters
EVAL_SIZE = 64


@dataclass
class ZooEntry:
    """One checkpoint file and what loading it must give."""

    name: str
    path: Path
    arch: str
    reference: nn.Module  # the backbone the file holds, built at EVAL_SIZE, in eval mode
    checkpoint_key: str | None = None  # the one option the file needs (None: none)
    expect: dict[str, Any] = field(default_factory=dict)  # provenance entries loading must record

    def spec_kwargs(self, with_key: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"arch": self.arch, "weights": str(self.path), "input_size": EVAL_SIZE}
        if with_key and self.checkpoint_key:
            out["checkpoint_key"] = self.checkpoint_key
        return out


def _net(arch: str, seed: int, **kwargs: Any) -> nn.Module:
    torch.manual_seed(seed)
    model = timm.create_model(arch, num_classes=0, **kwargs).eval()
    with torch.no_grad():  # non-trivial BN statistics: a missed buffer would show in the features
        for name, buf in model.named_buffers():
            if name.endswith("running_mean"):
                buf.uniform_(-0.1, 0.1)
    return model


def _prefixed(sd: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {prefix + k: v.clone() for k, v in sd.items()}


def _head(prefix: str, width: int, out: int = 16) -> dict[str, torch.Tensor]:
    """A two-layer projection MLP as SSL code names it (``fc.0``, ``fc.2``)."""
    return {f"{prefix}0.weight": torch.randn(width, width), f"{prefix}0.bias": torch.zeros(width),
            f"{prefix}2.weight": torch.randn(out, width), f"{prefix}2.bias": torch.zeros(out)}


def _optimizer_state() -> dict[str, Any]:
    return {"state": {0: {"momentum_buffer": torch.zeros(3)}}, "param_groups": [{"lr": 0.03, "params": [0]}]}


@contextlib.contextmanager
def _lightning_attribute_dict() -> Iterator[type]:
    """A class pickled as Lightning's ``AttributeDict`` (Lightning itself is not installed)."""
    names = ["lightning", "lightning.fabric", "lightning.fabric.utilities", "lightning.fabric.utilities.data"]
    cls = type("AttributeDict", (dict,), {"__module__": names[-1]})
    saved = {n: sys.modules.get(n) for n in names}
    for n in names:
        sys.modules[n] = types.ModuleType(n)
    sys.modules[names[-1]].AttributeDict = cls
    try:
        yield cls
    finally:
        for n, mod in saved.items():
            if mod is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = mod


def write_zoo(folder: Path) -> list[ZooEntry]:
    """Write every zoo checkpoint under ``folder``; one entry per file (and link)."""
    folder.mkdir(parents=True, exist_ok=True)
    entries: list[ZooEntry] = []
    r = _net(RESNET, 1)
    sd, width = r.state_dict(), r.num_features

    # MoCo v2: query and momentum (key) encoders under DDP's module., MLP heads in fc.0/fc.2
    moco = {"epoch": 200, "arch": "resnet50", "optimizer": _optimizer_state(),
            "state_dict": {**_prefixed(sd, "module.encoder_q."), **_head("module.encoder_q.fc.", width),
                           **{k: v + 1 for k, v in _prefixed(sd, "module.encoder_k.").items()},
                           **_head("module.encoder_k.fc.", width)}}
    torch.save(moco, folder / "moco_r18.pth.tar")
    entries.append(ZooEntry("moco", folder / "moco_r18.pth.tar", RESNET, r, expect={
        "checkpoint_key": "state_dict", "prefix_stripped": "module.encoder_q.",
        "dropped_groups": {"module.encoder_k.": len(sd) + 4, "module.encoder_q.fc.": 4}}))

    # DINO: teacher and student, each a backbone. with a head.; args as an argparse.Namespace
    d = _net(VIT, 2, img_size=224)
    dino_head = {"head.mlp.0.weight": torch.randn(8, d.num_features), "head.last_layer.weight_g": torch.ones(32, 1)}
    student = {k: v + 0.5 for k, v in _prefixed(d.state_dict(), "backbone.").items()}
    dino = {"teacher": {**_prefixed(d.state_dict(), "backbone."), **dino_head},
            "student": {**student, **dino_head}, "optimizer": _optimizer_state(), "epoch": 100,
            "args": argparse.Namespace(arch="vit_small", patch_size=16, lr=0.0005),
            "dino_loss": {"center": torch.zeros(1, 32)}}
    torch.save(dino, folder / "dino_checkpoint.pth")
    entries.append(ZooEntry("dino", folder / "dino_checkpoint.pth", VIT, _timm_at(d, folder / "_dino_ref.pth"),
                            checkpoint_key="teacher", expect={
                                "checkpoint_key": "teacher", "prefix_stripped": "backbone.",
                                "dropped_groups": {"head.": 2}, "resampled": ["pos_embed"]}))

    # Lightning: the LightningModule's self.model, hyper_parameters an AttributeDict; a .pth link
    lit = _net(RESNET, 3)
    with _lightning_attribute_dict() as attribute_dict:
        ckpt = {"epoch": 9, "global_step": 1200, "pytorch-lightning_version": "2.4.0",
                "state_dict": {**_prefixed(lit.state_dict(), "model."), "criterion.weight": torch.ones(10)},
                "loops": {"fit_loop": {"epoch_progress": {"total": {"ready": 10}}}},
                "callbacks": {"ModelCheckpoint{'monitor': 'val_loss'}": {"best_model_score": torch.tensor(0.4),
                                                                         "best_model_path": "epoch=9.ckpt"}},
                "optimizer_states": [_optimizer_state()], "lr_schedulers": [],
                "hyper_parameters": attribute_dict(arch="resnet18", lr=0.1)}
        torch.save(ckpt, folder / "last.ckpt")
    (folder / "last.pth").symlink_to("last.ckpt")
    lightning = {"checkpoint_key": "state_dict", "prefix_stripped": "model.", "dropped_groups": {"criterion.": 1}}
    entries.append(ZooEntry("lightning", folder / "last.ckpt", RESNET, lit, expect=lightning))
    entries.append(ZooEntry("lightning_link", folder / "last.pth", RESNET, lit, expect=lightning))

    # timm's train.py: state_dict and state_dict_ema, args, a numpy metric
    ema = _net(RESNET, 5)
    train = {"epoch": 30, "arch": RESNET, "state_dict": r.state_dict(), "state_dict_ema": ema.state_dict(),
             "optimizer": _optimizer_state(), "version": 2, "args": argparse.Namespace(model=RESNET, lr=0.4),
             "metric": np.float64(71.25)}
    torch.save(train, folder / "model_best.pth.tar")
    entries.append(ZooEntry("timm_train_ema", folder / "model_best.pth.tar", RESNET, ema,
                            checkpoint_key="state_dict_ema", expect={"checkpoint_key": "state_dict_ema"}))

    # torchvision's reference train.py: model, and model_ema as an AveragedModel (module. + n_averaged)
    tv_ema = _net(RESNET, 10)
    torch.save({"model": r.state_dict(), "model_ema": {**_prefixed(tv_ema.state_dict(), "module."),
                                                       "n_averaged": torch.tensor(120)},
                "optimizer": _optimizer_state(), "lr_scheduler": {"last_epoch": 3}, "epoch": 3,
                "args": argparse.Namespace(model="resnet18", model_ema=True)}, folder / "checkpoint.pth")
    entries.append(ZooEntry("torchvision_model_ema", folder / "checkpoint.pth", RESNET, tv_ema,
                            checkpoint_key="model_ema", expect={
                                "checkpoint_key": "model_ema", "prefix_stripped": "module.",
                                "dropped_groups": {"n_averaged": 1}}))

    # BYOL: online network (encoder. + projection.) and its target copy
    online = _net(RESNET, 6)
    byol = {"online_network_state_dict": {**_prefixed(online.state_dict(), "encoder."),
                                          **_head("projection.net.", width)},
            "target_network_state_dict": {k: v * 0.9 for k, v in _prefixed(online.state_dict(), "encoder.").items()},
            "optimizer_state_dict": _optimizer_state()}
    torch.save(byol, folder / "byol_model.pt")
    entries.append(ZooEntry("byol", folder / "byol_model.pt", RESNET, online, expect={
        "checkpoint_key": "online_network_state_dict", "prefix_stripped": "encoder.",
        "dropped_groups": {"projection.": 4}}))

    # MAE: the ViT's encoder beside its decoder, trained at 224 px, evaluated at 64
    m = _net(VIT, 7, img_size=224)
    w = m.num_features
    decoder = {"mask_token": torch.zeros(1, 1, w), "decoder_embed.weight": torch.randn(w, w),
               "decoder_blocks.0.norm1.weight": torch.ones(w), "decoder_pred.weight": torch.randn(16, w)}
    torch.save({"model": {**m.state_dict(), **decoder}, "optimizer": _optimizer_state(), "epoch": 799,
                "scaler": {"scale": 65536.0}, "args": argparse.Namespace(model="mae_vit", input_size=224)},
               folder / "mae_checkpoint-799.pth")
    mae_ref = _timm_at(m, folder / "_mae_ref.pth")
    entries.append(ZooEntry("mae_224_at_64", folder / "mae_checkpoint-799.pth", VIT, mae_ref,
                            expect={"checkpoint_key": "model", "resampled": ["pos_embed"],
                                    "dropped_groups": {"mask_token": 1, "decoder_embed.": 1, "decoder_blocks.": 1,
                                                       "decoder_pred.": 1}}))

    # plain state dicts: timm as safetensors, Hugging Face's pytorch_model.bin, torchvision's resnet18
    plain = _net(RESNET, 8)
    save_file(plain.state_dict(), folder / "model.safetensors")
    entries.append(ZooEntry("timm_safetensors", folder / "model.safetensors", RESNET, plain))
    torch.save(plain.state_dict(), folder / "pytorch_model.bin")
    entries.append(ZooEntry("hf_bin", folder / "pytorch_model.bin", RESNET, plain))
    import torchvision

    torch.manual_seed(9)
    tv = torchvision.models.resnet18(num_classes=10)
    torch.save(tv.state_dict(), folder / "resnet18_torchvision.pth")
    ref = timm.create_model("resnet18", num_classes=0)
    ref.load_state_dict({k: v for k, v in tv.state_dict().items() if not k.startswith("fc.")})
    entries.append(ZooEntry("torchvision", folder / "resnet18_torchvision.pth", "resnet18", ref.eval(),
                            expect={"dropped_groups": {"fc.": 2}}))
    return entries


def _timm_at(model: nn.Module, plain: Path) -> nn.Module:
    """``model``'s weights in a ViT built at EVAL_SIZE, loaded by timm's own pretrained path
    (its filter resamples the position embeddings): the reference for features at 64 px."""
    torch.save(model.state_dict(), plain)
    return timm.create_model(VIT, img_size=EVAL_SIZE, num_classes=0, pretrained=True,
                             pretrained_cfg_overlay={"file": str(plain)}).eval()


def reference_features(entry: ZooEntry, batch: torch.Tensor) -> np.ndarray:
    """timm's pre-logits forward pass of the entry's backbone."""
    with torch.no_grad():
        return entry.reference.forward_head(entry.reference.forward_features(batch), pre_logits=True).numpy()

"""Pretrained weights from the local caches only: repeval never downloads."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import timm
import torch
from torch import nn

from pipeline.encoders.building import create_model
from pipeline.encoders.spec import EncoderSpec, split_tag
from pipeline.errors import ConfigError, HubUnavailableError, unknown_name

_HF_DEFAULT_FILES = ("model.safetensors", "pytorch_model.bin")


def local_file_hint(spec: EncoderSpec) -> str:
    """How to give a local checkpoint instead, in config syntax."""
    return (f"Give a local checkpoint file instead: in the config, set `weights: /path/to/ckpt.safetensors` "
            f"for encoder {spec.name!r} (arch {spec.arch!r}); .safetensors, .pth, .pt and .bin files are read.")


def create_pretrained(spec: EncoderSpec, kwargs: Mapping[str, Any]) -> nn.Module:
    """Build ``spec``'s model with timm's pretrained weights from the local cache."""
    model_name = spec.model_name
    check_pretrained_available(spec)
    try:
        return create_model(spec, pretrained=True, **kwargs)
    except ConfigError:
        raise
    except Exception as exc:  # timm/hub raise many types when offline; all mean "not available"
        raise HubUnavailableError(
            f"Could not load pretrained weights for {model_name!r}: {exc}. {local_file_hint(spec)}"
        ) from exc


def check_pretrained_available(spec: EncoderSpec) -> None:
    """Refuse pretrained weights that are not in a local cache, without loading them."""
    model_name = spec.model_name
    try:
        cfg = timm.models.get_pretrained_cfg(model_name, allow_unregistered=False)
    except RuntimeError:
        base = split_tag(model_name)[0]
        raise unknown_name(f"pretrained tag for {base}", model_name, timm.list_pretrained(f"{base}.*")) from None
    if not pretrained_cached(cfg.to_dict()):
        raise HubUnavailableError(
            f"Pretrained weights for {model_name!r} are not in the local hub cache and repeval never downloads "
            f"(HF_HUB_OFFLINE). {local_file_hint(spec)}"
        )


def pretrained_cached(cfg: Mapping[str, Any]) -> bool:
    """Whether timm would find the weights of a pretrained config locally (no network)."""
    source, hub_id = cfg.get("source") or "", cfg.get("hf_hub_id")
    if source == "hf-hub" and hub_id:
        return _in_hf_cache(hub_id, cfg.get("hf_hub_filename"))
    if source == "local-dir":
        return _is_file(cfg.get("file"))
    if cfg.get("state_dict"):
        return True
    if cfg.get("file"):
        return _is_file(cfg["file"])
    if hub_id:
        return _in_hf_cache(hub_id, cfg.get("hf_hub_filename"))
    if cfg.get("url"):
        name = os.path.basename(str(cfg["url"]).split("?")[0])
        return os.path.isfile(os.path.join(torch.hub.get_dir(), "checkpoints", name))
    return False


def _is_file(path: object) -> bool:
    return bool(path) and os.path.exists(str(path))


def _in_hf_cache(hub_id: str, filename: str | None) -> bool:
    from huggingface_hub import constants, try_to_load_from_cache

    repo_id, _, revision = hub_id.partition("@")
    # Read the cache directory at call time, so a changed HF_HUB_CACHE is honoured.
    cached = (
        try_to_load_from_cache(repo_id, f, cache_dir=constants.HF_HUB_CACHE, revision=revision or None)
        for f in ([filename] if filename else _HF_DEFAULT_FILES)
    )
    return any(isinstance(path, str) for path in cached)

"""Frozen timm encoders: specs, strict weight loading and one-pass multi-layer features.

Layers: ``pre_logits`` is timm's pooled pre-classifier representation
(``forward_head(forward_features(x), pre_logits=True)``); ``block{i}`` is the i-th output of
``forward_intermediates`` as timm counts them (CNN stages, stem included where the model
reports it; ViT blocks), pooled to one vector per image (PROTOCOLS.md section 1).

The model is always built without its classifier (``num_classes=0``): features never need
it, so a checkpoint whose head has any number of classes loads, and so does a backbone-only
one; head tensors in a checkpoint are dropped, every other tensor must match exactly.
"""

from __future__ import annotations

import os

# No network: pretrained weights come from the local cache or not at all.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import contextlib
import dataclasses
import inspect
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import timm
import torch
from PIL import Image
from timm.data import create_transform, resolve_model_data_config
from torch import Tensor, nn

from pipeline.checkpoints import CHECKPOINT_EXTENSIONS, load_state_dict, weights_fingerprint
from pipeline.errors import CheckpointError, ConfigError, HubUnavailableError, unknown_name
from pipeline.names import validate_name

__all__ = ["EncoderSpec", "Encoder", "load_encoder", "list_architectures", "PRE_LOGITS"]

PRE_LOGITS = "pre_logits"
_BLOCK_RE = re.compile(r"^block(0|[1-9][0-9]*)$")
_PRETRAINED_PREFIX = "timm:"
_MAX_LISTED_KEYS = 10
# torch's RNG is one per process: two threads seeding and building models at once (Dask
# workers with threads) would interleave draws and get other random-init weights each run.
# repeval's other torch draws use their own generators (the extraction's DataLoader).
_INIT_LOCK = threading.Lock()


def _repeval_version() -> str:
    try:
        return metadata.version("repeval")
    except metadata.PackageNotFoundError:
        return "0.1.0"


def list_architectures(pattern: str = "*") -> list[str]:
    """Names of timm architectures matching a glob pattern."""
    return timm.list_models(pattern)


@dataclass(frozen=True)
class EncoderSpec:
    """What to build: a named timm architecture, its weights and the layers to extract.

    ``weights`` is ``"random"`` (seeded init), a local checkpoint path (.safetensors, .pth,
    .pt, .bin), ``"pretrained"`` (timm's default tag) or ``"timm:<tag>"``; the last two only
    from the local hub cache. ``input_size`` overrides the square input resolution (ViTs are
    built for it). Checked on construction: name, architecture and layer syntax.
    """

    name: str
    arch: str
    weights: str = "random"
    seed: int = 0
    layers: tuple[str, ...] = (PRE_LOGITS,)
    input_size: int | None = None
    strip_prefixes: tuple[str, ...] = ("module.",)

    def __post_init__(self) -> None:
        validate_name(self.name, "encoder name")
        for field in ("layers", "strip_prefixes"):
            if isinstance(getattr(self, field), str):
                raise ConfigError(f"{field} must be a sequence of strings, got the string {getattr(self, field)!r}")
        # Lists from JSON/YAML become tuples so the spec stays hashable.
        object.__setattr__(self, "layers", tuple(self.layers))
        object.__setattr__(self, "strip_prefixes", tuple(self.strip_prefixes))
        base_arch, arch_tag = timm.models.split_model_name_tag(self.arch) if isinstance(self.arch, str) else ("", "")
        if not timm.is_model(base_arch):
            raise unknown_name("timm architecture", self.arch, timm.list_models())
        if not isinstance(self.weights, str) or not self.weights:
            raise ConfigError(
                f"weights must be 'random', 'pretrained', 'timm:<tag>' or a checkpoint path, got {self.weights!r}"
            )
        if self.weights == _PRETRAINED_PREFIX:
            raise ConfigError(f"weights {self.weights!r} names no tag; use 'pretrained' or 'timm:<tag>'")
        other_tag = self.weights != f"{_PRETRAINED_PREFIX}{arch_tag}"
        if self.weights.startswith(_PRETRAINED_PREFIX) and arch_tag and other_tag:
            raise ConfigError(
                f"arch {self.arch!r} already names tag {arch_tag!r}; weights {self.weights!r} asks for another"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"seed must be an int, got {self.seed!r}")
        if self.input_size is not None and (
            isinstance(self.input_size, bool) or not isinstance(self.input_size, int) or self.input_size <= 0
        ):
            raise ConfigError(f"input_size must be a positive int or None, got {self.input_size!r}")
        if not self.layers:
            raise ConfigError(f"encoder {self.name!r}: layers must not be empty; e.g. ({PRE_LOGITS!r},)")
        for layer in self.layers:
            if not isinstance(layer, str) or (layer != PRE_LOGITS and not _BLOCK_RE.match(layer)):
                raise ConfigError(
                    f"encoder {self.name!r}: layer {layer!r} is not {PRE_LOGITS!r} or 'block<i>' (e.g. 'block3')"
                )
        if len(set(self.layers)) != len(self.layers):
            raise ConfigError(f"encoder {self.name!r}: duplicate layers in {list(self.layers)}")

    @property
    def weights_kind(self) -> str:
        """One of ``random``, ``pretrained`` or ``checkpoint``."""
        if self.weights == "random":
            return "random"
        if self.weights == "pretrained" or self.weights.startswith(_PRETRAINED_PREFIX):
            return "pretrained"
        return "checkpoint"

    def to_dict(self) -> dict[str, Any]:
        """JSON-able fields (tuples as lists)."""
        out = dataclasses.asdict(self)
        out["layers"] = list(self.layers)
        out["strip_prefixes"] = list(self.strip_prefixes)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EncoderSpec:
        """Inverse of :meth:`to_dict`; unknown keys are an error, not ignored."""
        fields = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise ConfigError(f"Unknown EncoderSpec field(s) {unknown}; valid fields: {', '.join(fields)}")
        return cls(**data)


class Encoder:
    """A loaded, frozen encoder: preprocessing, one-pass multi-layer features, provenance."""

    def __init__(
        self,
        spec: EncoderSpec,
        model: nn.Module,
        device: torch.device,
        fingerprint: str,
        autocast: bool,
        weights_info: dict[str, Any],
    ) -> None:
        self.spec = spec
        self.model = model
        self.device = device
        self.weights_fingerprint = fingerprint
        self.layers: tuple[str, ...] = spec.layers
        self.autocast = autocast
        self._weights_info = weights_info
        self._class_token = _uses_class_token(model)
        self._feature_dims: dict[str, int] | None = None
        self.data_config: dict[str, Any] = dict(resolve_model_data_config(model))
        if spec.input_size is not None:
            self.data_config["input_size"] = (3, spec.input_size, spec.input_size)
        _check_layers(spec, self.available_layers)

    @property
    def available_layers(self) -> tuple[str, ...]:
        """``pre_logits`` then ``block0`` .. ``block{n-1}`` as forward_intermediates counts."""
        return _available_layers(self.model)

    def pooling(self, layer: str) -> str:
        """How a layer's output becomes one vector per image."""
        if layer == PRE_LOGITS:
            pool = _head_pool_type(self.model)
            return "forward_head(pre_logits=True)" + (f", global_pool={pool}" if pool else "")
        if self._class_token:
            return "cls_token"
        if getattr(self.model, "num_prefix_tokens", None) is not None:
            return "mean_patch_tokens"
        return "global_avg_pool"

    def layer_pooling(self) -> dict[str, str]:
        """Pooling of every requested layer."""
        return {layer: self.pooling(layer) for layer in self.layers}

    def transform(self) -> Callable[[Image.Image], Tensor]:
        """timm's eval transform for this model's data config (no augmentation)."""
        return create_transform(**self.data_config, is_training=False)

    def forward(self, x: Tensor) -> dict[str, np.ndarray]:
        """Every requested layer from ONE forward pass, as float32 arrays of shape (n, d)."""
        blocks = sorted(int(layer[len("block"):]) for layer in self.layers if layer != PRE_LOGITS)
        want_pre = PRE_LOGITS in self.layers
        x = x.to(self.device, non_blocking=True)
        out: dict[str, Tensor] = {}
        amp = torch.autocast("cuda", dtype=torch.float16) if self.autocast else contextlib.nullcontext()
        with torch.inference_mode(), amp:
            if not blocks:
                out[PRE_LOGITS] = self.model.forward_head(self.model.forward_features(x), pre_logits=True)
            else:
                final, inters = self._intermediates(x, blocks, intermediates_only=not want_pre)
                if want_pre:
                    out[PRE_LOGITS] = self.model.forward_head(final, pre_logits=True)
                for index, inter in zip(blocks, inters):
                    out[f"block{index}"] = _pool(inter)
        return {layer: out[layer].float().cpu().numpy().reshape(x.shape[0], -1) for layer in self.layers}

    __call__ = forward

    def _intermediates(
        self, x: Tensor, blocks: list[int], intermediates_only: bool
    ) -> tuple[Tensor | None, list[Tensor]]:
        params = inspect.signature(self.model.forward_intermediates).parameters
        kwargs: dict[str, Any] = {"indices": blocks, "intermediates_only": intermediates_only}
        if intermediates_only and "stop_early" in params:
            kwargs["stop_early"] = True  # nothing after the last requested block is needed
        if self._class_token:
            kwargs["return_prefix_tokens"] = True
        result = self.model.forward_intermediates(x, **kwargs)
        inters = result if intermediates_only else result[1]
        if self._class_token:
            # (spatial, prefix) pairs; the class token is the first prefix token in timm.
            inters = [prefix[:, 0] for _, prefix in inters]
        return (None if intermediates_only else result[0]), list(inters)

    def feature_dims(self) -> dict[str, int]:
        """Feature width per requested layer (one dummy forward of batch 1, cached)."""
        if self._feature_dims is None:
            dummy = torch.zeros((1, *self.data_config["input_size"]))
            self._feature_dims = {layer: int(arr.shape[1]) for layer, arr in self.forward(dummy).items()}
        return dict(self._feature_dims)

    def provenance(self) -> dict[str, Any]:
        """JSON-able record of what produced the features (no paths or URLs)."""
        return {
            "name": self.spec.name,
            "arch": self.spec.arch,
            "weights": dict(self._weights_info),
            "weights_fingerprint": self.weights_fingerprint,
            "data_config": _jsonable(self.data_config),
            "layers": {layer: {"pooling": pool} for layer, pool in self.layer_pooling().items()},
            "versions": {"torch": torch.__version__, "timm": timm.__version__, "repeval": _repeval_version()},
            "device": self.device.type,
            "autocast": self.autocast,
            "autocast_dtype": "float16" if self.autocast else None,
        }

    def __repr__(self) -> str:
        return f"Encoder(name={self.spec.name!r}, arch={self.spec.arch!r}, device={str(self.device)!r})"


def load_encoder(
    spec: EncoderSpec,
    device: str | torch.device | None = None,
    autocast: bool | None = None,
) -> Encoder:
    """Build the model of ``spec`` with its weights, in eval mode on ``device``.

    ``device`` defaults to CUDA when available, else CPU. ``autocast`` (float16) defaults to
    on for CUDA and is never used on CPU.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    use_autocast = device.type == "cuda" if autocast is None else bool(autocast and device.type == "cuda")
    kind = spec.weights_kind
    ckpt_path: Path | None = None
    if kind == "checkpoint":
        ckpt_path = Path(spec.weights).expanduser()
        if ckpt_path.suffix.lower() not in CHECKPOINT_EXTENSIONS:
            raise CheckpointError(
                f"weights {spec.weights!r} is neither 'random', 'pretrained', 'timm:<tag>' nor a checkpoint "
                f"with extension {', '.join(CHECKPOINT_EXTENSIONS)}"
            )
        if not ckpt_path.is_file():
            raise CheckpointError(
                f"Checkpoint file {spec.weights!r} for encoder {spec.name!r} does not exist"
            )

    model_name = _model_name(spec)
    kwargs: dict[str, Any] = {"num_classes": 0}
    if spec.input_size is not None and _fixed_input_size(model_name):
        kwargs["img_size"] = spec.input_size  # ViT-like models fix the grid of positions at creation

    if kind == "pretrained":
        model = _create_pretrained(spec, model_name, kwargs)
        info: dict[str, Any] = {"source": "timm-pretrained", "tag": model_name}
        hub_id = (getattr(model, "pretrained_cfg", None) or {}).get("hf_hub_id")
        if hub_id:
            info["hf_hub_id"] = hub_id
    else:
        with _INIT_LOCK:
            torch.manual_seed(spec.seed)
            model = _create(model_name, spec, pretrained=False, **kwargs)
        _check_layers(spec, _available_layers(model))  # before reading a possibly large checkpoint
        info = {"source": "random", "seed": spec.seed}
        if ckpt_path is not None:
            _load_checkpoint_into(model, ckpt_path, spec)
            info = {"source": "checkpoint", "file": ckpt_path.name}
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
    fingerprint = weights_fingerprint(model)  # on CPU, before the move
    model.to(device)
    return Encoder(spec, model, device, fingerprint, use_autocast, info)


def _model_name(spec: EncoderSpec) -> str:
    if spec.weights.startswith(_PRETRAINED_PREFIX):
        base, _ = timm.models.split_model_name_tag(spec.arch)
        return f"{base}.{spec.weights[len(_PRETRAINED_PREFIX):]}"
    return spec.arch


def _create(model_name: str, spec: EncoderSpec, **kwargs: Any) -> nn.Module:
    try:
        return timm.create_model(model_name, **kwargs)
    except TypeError as exc:
        if "img_size" not in str(exc):
            raise
        raise ConfigError(
            f"encoder {spec.name!r}: {spec.arch} has a fixed input size and cannot be built for "
            f"input_size={spec.input_size}; leave input_size unset"
        ) from exc


def _fixed_input_size(model_name: str) -> bool:
    try:
        cfg = timm.models.get_pretrained_cfg(model_name)
    except RuntimeError:
        return False
    return bool(cfg is not None and cfg.fixed_input_size)


def _create_pretrained(spec: EncoderSpec, model_name: str, kwargs: dict[str, Any]) -> nn.Module:
    hint = (
        f"Pass a local checkpoint instead, e.g. EncoderSpec(name={spec.name!r}, arch={spec.arch!r}, "
        "weights='/path/to/ckpt.safetensors')."
    )
    base, _ = timm.models.split_model_name_tag(model_name)
    try:
        cfg = timm.models.get_pretrained_cfg(model_name, allow_unregistered=False)
    except RuntimeError:
        tags = timm.list_pretrained(f"{base}.*")
        raise unknown_name(f"pretrained tag for {base}", model_name, tags) from None
    if not _pretrained_cached(cfg.to_dict()):
        raise HubUnavailableError(
            f"Pretrained weights for {model_name!r} are not in the local hub cache and repeval "
            f"never downloads (HF_HUB_OFFLINE). {hint}"
        )
    try:
        return _create(model_name, spec, pretrained=True, **kwargs)
    except ConfigError:
        raise
    except Exception as exc:  # timm/hub raise many types when offline; all mean "not available"
        raise HubUnavailableError(
            f"Could not load pretrained weights for {model_name!r}: {exc}. {hint}"
        ) from exc


def _pretrained_cached(cfg: dict[str, Any]) -> bool:
    """Whether timm would find the weights of ``cfg`` locally (never touches the network)."""
    from timm.models._builder import _resolve_pretrained_source

    load_from, loc = _resolve_pretrained_source(cfg)
    if load_from == "state_dict":
        return True
    if load_from in ("file", "local-dir"):
        return bool(loc) and os.path.exists(loc)
    if load_from == "url":
        name = os.path.basename(str(loc).split("?")[0])
        return os.path.isfile(os.path.join(torch.hub.get_dir(), "checkpoints", name))
    if load_from == "hf-hub":
        from huggingface_hub import constants, try_to_load_from_cache

        if isinstance(loc, tuple):
            repo_id, filenames = loc[0], [loc[1]]
        else:
            repo_id, filenames = loc, ["model.safetensors", "pytorch_model.bin"]
        repo_id, _, revision = repo_id.partition("@")
        # Read the cache directory at call time, so a changed HF_HUB_CACHE is honoured.
        cached = (
            try_to_load_from_cache(repo_id, f, cache_dir=constants.HF_HUB_CACHE, revision=revision or None)
            for f in filenames
        )
        return any(isinstance(path, str) for path in cached)
    return False  # timm would silently fall back to random init: treat as unavailable


def _load_checkpoint_into(model: nn.Module, path: Path, spec: EncoderSpec) -> None:
    """Strict load, except classifier-head tensors (dropped) and BN step counters."""
    state = load_state_dict(path, strip_prefixes=spec.strip_prefixes)
    expected = model.state_dict()
    heads = _classifier_prefixes(model)
    dropped = {k for k in state if k not in expected and any(k.startswith(h) for h in heads)}
    unexpected = sorted(set(state) - set(expected) - dropped)
    # num_batches_tracked only counts training steps; eval-mode BN never reads it.
    missing = sorted(k for k in set(expected) - set(state) if not k.endswith("num_batches_tracked"))
    mismatched = sorted(
        f"{k} (checkpoint {tuple(state[k].shape)}, model {tuple(expected[k].shape)})"
        for k in set(state) & set(expected)
        if state[k].shape != expected[k].shape
    )
    if missing or unexpected or mismatched:
        parts = [
            _key_summary(f"{len(keys)} {what}", keys)
            for what, keys in (
                ("missing keys", missing), ("unexpected keys", unexpected), ("shape mismatches", mismatched)
            )
            if keys
        ]
        hint = _prefix_hint(unexpected, expected)
        raise CheckpointError(
            f"Checkpoint {path.name!r} does not match architecture {spec.arch!r}: " + "; ".join(parts) + hint
        )
    model.load_state_dict({k: v for k, v in state.items() if k not in dropped}, strict=False)


def _key_summary(title: str, keys: list[str]) -> str:
    shown = ", ".join(keys[:_MAX_LISTED_KEYS])
    more = f", ... ({len(keys) - _MAX_LISTED_KEYS} more)" if len(keys) > _MAX_LISTED_KEYS else ""
    return f"{title}: {shown}{more}"


def _prefix_hint(unexpected: list[str], expected: Mapping[str, Tensor]) -> str:
    firsts = {k.split(".", 1)[0] for k in unexpected if "." in k}
    if len(firsts) == 1 and len(unexpected) >= 1:
        prefix = firsts.pop() + "."
        if any(k[len(prefix):] in expected for k in unexpected):
            return f". The unexpected keys share prefix {prefix!r}: add it to strip_prefixes"
    return ""


def _classifier_prefixes(model: nn.Module) -> tuple[str, ...]:
    cfg = getattr(model, "pretrained_cfg", None) or {}
    names = cfg.get("classifier") or ()
    names = (names,) if isinstance(names, str) else tuple(names)
    return tuple(f"{n}." for n in names)


def _available_layers(model: nn.Module) -> tuple[str, ...]:
    """``pre_logits`` plus one ``block{i}`` per output forward_intermediates can give.

    timm sizes forward_intermediates' index range by ``feature_info`` (CNN stages incl. the
    stem where reported, ViT blocks), so its length is the block count.
    """
    if not hasattr(model, "forward_intermediates"):
        return (PRE_LOGITS,)
    count = len(getattr(model, "feature_info", None) or ())
    return (PRE_LOGITS,) + tuple(f"block{i}" for i in range(count))


def _uses_class_token(model: nn.Module) -> bool:
    """A ViT-like model with a class token whose forward_intermediates can return it."""
    if getattr(model, "cls_token", None) is None or not hasattr(model, "forward_intermediates"):
        return False
    return "return_prefix_tokens" in inspect.signature(model.forward_intermediates).parameters


def _head_pool_type(model: nn.Module) -> str | None:
    for owner in (model, getattr(model, "head", None)):
        pool = getattr(owner, "global_pool", None)
        if isinstance(pool, str):
            return pool or None
        if pool is not None and isinstance(getattr(pool, "pool_type", None), str):
            return pool.pool_type or None
    return None


def _pool(t: Tensor) -> Tensor:
    """One vector per image: spatial mean of NCHW maps, token mean of NLC, as-is for (n, d)."""
    if t.ndim == 4:
        return t.mean(dim=(2, 3))
    if t.ndim == 3:
        return t.mean(dim=1)
    return t


def check_layers_available(spec: EncoderSpec) -> None:
    """Refuse layers that ``spec.arch`` lacks, before any work: the model is built on the meta
    device (no weights, no memory; milliseconds), so a config fails at load, not in a task."""
    model_name = _model_name(spec)
    kwargs: dict[str, Any] = {"num_classes": 0}
    if spec.input_size is not None and _fixed_input_size(model_name):
        kwargs["img_size"] = spec.input_size
    try:
        with torch.device("meta"):
            model = _create(model_name, spec, pretrained=False, **kwargs)
    except (RuntimeError, ValueError, TypeError, NotImplementedError):
        return  # e.g. a tag only the hub knows: the extraction itself will say what is wrong
    _check_layers(spec, _available_layers(model))


def _check_layers(spec: EncoderSpec, available: tuple[str, ...]) -> None:
    for layer in spec.layers:
        if layer not in available:
            raise unknown_name(f"layer of {spec.arch}", layer, available)


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.generic,)):
        return value.item()
    return value

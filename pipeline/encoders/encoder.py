"""A loaded, frozen encoder: strict weight loading and one-pass multi-layer features."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any

import numpy as np
import timm
import torch
from PIL import Image
from timm.data import create_transform, resolve_model_data_config
from torch import Tensor, nn

from pipeline.encoders.checkpoints.reading import weights_fingerprint
from pipeline.encoders.building import (
    INIT_LOCK, available_layers, build_on_meta, check_layer_names, create_model, model_kwargs,
)
from pipeline.encoders.hub import create_pretrained
from pipeline.encoders.outputs import grid_map, pooled, tokens_of
from pipeline.encoders.precision import autocast_dtype
from pipeline.encoders.checkpoints.matching import checkpoint_path, load_checkpoint_into
from pipeline.encoders.spec import (
    MAP_SUFFIX, PRE_LOGITS, TOKENS_SUFFIX, EncoderSpec, base_layer, check_architecture, is_map_layer,
    is_token_layer, layer_kind,
)


class Encoder:
    """A loaded, frozen encoder: preprocessing, one-pass multi-layer features, provenance.

    Built by :func:`load_encoder`.

    Parameters
    ----------
    spec : EncoderSpec
        What was built.
    model : torch.nn.Module
        The timm model, in eval mode, on ``device``.
    device : torch.device
        Where the forward pass runs.
    fingerprint : str
        The weights fingerprint (:func:`pipeline.encoders.checkpoints.reading.weights_fingerprint`).
    autocast : torch.dtype, bool or None
        The autocast dtype of the forward pass (float16 or bfloat16); True means
        float16; None or False: float32 throughout.
    weights_info : dict
        Where the weights came from (random seed, checkpoint file name, hub tag).
    channels_last : bool
        Whether the model and its input batches use the channels-last memory format.
    """

    def __init__(self, spec: EncoderSpec, model: nn.Module, device: torch.device, fingerprint: str,
                 autocast: torch.dtype | bool | None, weights_info: dict[str, Any],
                 channels_last: bool = False) -> None:
        self.spec = spec
        self.model = model
        self.device = device
        self.weights_fingerprint = fingerprint
        self.layers: tuple[str, ...] = spec.layers
        self.autocast_dtype: torch.dtype | None = torch.float16 if autocast is True else (autocast or None)
        self.channels_last = bool(channels_last)
        self._weights_info = weights_info
        self._class_token = _uses_class_token(model)
        self._feature_shapes: dict[str, tuple[int, ...]] | None = None
        self.data_config: dict[str, Any] = dict(resolve_model_data_config(model))
        if spec.input_size is not None:
            self.data_config["input_size"] = (3, spec.input_size, spec.input_size)
        check_layer_names(spec, self.available_layers)

    @property
    def autocast(self) -> bool:
        """Whether the forward pass runs under autocast (float16 or bfloat16)."""
        return self.autocast_dtype is not None

    @property
    def compute_precision(self) -> str:
        """How the forward pass computes, as the features' fingerprint records it.

        ``float32``, ``float16-autocast`` or ``bfloat16-autocast``, with
        ``+channels_last`` when that memory format is used (its kernels round
        differently).
        """
        base = f"{str(self.autocast_dtype).removeprefix('torch.')}-autocast" if self.autocast else "float32"
        return base + ("+channels_last" if self.channels_last else "")

    @property
    def available_layers(self) -> tuple[str, ...]:
        """``pre_logits`` then ``block0`` .. ``block{n-1}`` as forward_intermediates counts."""
        return available_layers(self.model)

    def pooling(self, layer: str) -> str:
        """How a layer's output becomes one vector per image.

        Parameters
        ----------
        layer : str
            A layer name.

        Returns
        -------
        str
            A short description, recorded with the features.
        """
        if is_token_layer(layer):
            if self._class_token:
                return "tokens: class token and patch tokens"
            if getattr(self.model, "num_prefix_tokens", None) is not None:
                return "tokens: patch tokens"
            return "tokens: spatial positions"
        if is_map_layer(layer):
            if getattr(self.model, "num_prefix_tokens", None) is not None:
                return "map: patch tokens on their grid"
            return "map: spatial feature map"
        if layer == PRE_LOGITS:
            pool = _head_pool_type(self.model)
            return "forward_head(pre_logits=True)" + (f", global_pool={pool}" if pool else "")
        if self._class_token:
            return "cls_token"
        if getattr(self.model, "num_prefix_tokens", None) is not None:
            return "mean_patch_tokens"
        return "global_avg_pool"

    def layer_pooling(self) -> dict[str, str]:
        """Pooling of every requested layer.

        Returns
        -------
        dict
            Layer name -> :meth:`pooling`.
        """
        return {layer: self.pooling(layer) for layer in self.layers}

    def transform(self) -> Callable[[Image.Image], Tensor]:
        """timm's eval transform for this model's data config (no augmentation).

        Returns
        -------
        callable
            PIL image -> normalised tensor.
        """
        return create_transform(**self.data_config, is_training=False)

    def forward(self, x: Tensor) -> dict[str, np.ndarray]:
        """Every requested layer from ONE forward pass.

        Parameters
        ----------
        x : torch.Tensor
            A batch of preprocessed images, ``(n, 3, h, w)``.

        Returns
        -------
        dict
            Layer name -> float32 array of shape ``(n, d)``, ``(n, T, d)`` for a token layer,
            or ``(n, h, w, d)`` for a map layer.
        """
        return {layer: t.float().cpu().numpy() for layer, t in self.forward_tensors(x).items()}

    __call__ = forward

    def forward_tensors(self, x: Tensor) -> dict[str, Tensor]:
        """Every requested layer from ONE forward pass, as ``(n, d)`` tensors on the device.

        The input is copied to the device without blocking (from pinned memory, the copy
        overlaps the work queued before it); the outputs keep the compute dtype.

        Parameters
        ----------
        x : torch.Tensor
            A batch of preprocessed images, ``(n, 3, h, w)``.

        Returns
        -------
        dict
            Layer name -> tensor of shape ``(n, d)``, ``(n, T, d)`` for a token layer, or
            ``(n, h, w, d)`` for a map layer.
        """
        blocks = sorted({int(base_layer(layer)[len("block"):]) for layer in self.layers if layer != PRE_LOGITS})
        want_pre = PRE_LOGITS in self.layers
        x = x.to(self.device, non_blocking=True)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        out: dict[str, Tensor] = {}
        amp = (torch.autocast(self.device.type, dtype=self.autocast_dtype) if self.autocast
               else contextlib.nullcontext())
        with torch.inference_mode(), amp:
            if not blocks:
                out[PRE_LOGITS] = self.model.forward_head(self.model.forward_features(x), pre_logits=True)
            else:
                final, inters = self._intermediates(x, blocks, intermediates_only=not want_pre)
                if want_pre:
                    out[PRE_LOGITS] = self.model.forward_head(final, pre_logits=True)
                for index, (spatial, prefix) in zip(blocks, inters):
                    name = f"block{index}"
                    if name in self.layers:
                        out[name] = prefix[:, 0] if self._class_token else pooled(spatial)
                    if name + TOKENS_SUFFIX in self.layers:
                        out[name + TOKENS_SUFFIX] = tokens_of(spatial, prefix)
                    if name + MAP_SUFFIX in self.layers:
                        out[name + MAP_SUFFIX] = grid_map(spatial, name + MAP_SUFFIX)
        return {layer: out[layer] if layer_kind(layer) != "pooled" else out[layer].reshape(x.shape[0], -1)
                for layer in self.layers}

    def _intermediates(self, x: Tensor, blocks: list[int],
                       intermediates_only: bool) -> tuple[Tensor | None, list[tuple[Tensor, Tensor | None]]]:
        """(final features or None, one (spatial output, prefix tokens or None) per block)."""
        params = inspect.signature(self.model.forward_intermediates).parameters
        kwargs: dict[str, Any] = {"indices": blocks, "intermediates_only": intermediates_only}
        if intermediates_only and "stop_early" in params:
            kwargs["stop_early"] = True  # nothing after the last requested block is needed
        if self._class_token:
            kwargs["return_prefix_tokens"] = True
        result = self.model.forward_intermediates(x, **kwargs)
        inters = result if intermediates_only else result[1]
        # with prefix tokens: (spatial, prefix) pairs; the class token is the first prefix token in timm
        pairs = [tuple(i) for i in inters] if self._class_token else [(i, None) for i in inters]
        return (None if intermediates_only else result[0]), pairs

    def feature_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shape of one image's features per requested layer: ``(d,)``, ``(T, d)`` for a
        token layer or ``(h, w, d)`` for a map layer (one dummy forward of batch 1, cached).

        Returns
        -------
        dict
            Layer name -> shape.
        """
        if self._feature_shapes is None:
            # on the encoder's device, never copied back: the meta device (no weights) works too
            dummy = torch.zeros((1, *self.data_config["input_size"]), device=self.device)
            self._feature_shapes = {layer: tuple(int(s) for s in t.shape[1:])
                                    for layer, t in self.forward_tensors(dummy).items()}
        return dict(self._feature_shapes)

    def feature_dims(self) -> dict[str, int]:
        """Feature width per requested layer (``d``, also of a token layer).

        Returns
        -------
        dict
            Layer name -> width.
        """
        return {layer: shape[-1] for layer, shape in self.feature_shapes().items()}

    def provenance(self) -> dict[str, Any]:
        """JSON-able record of what produced the features (no paths or URLs).

        Returns
        -------
        dict
            Name, architecture, weights source and fingerprint, data config, pooling,
            library versions, device and precision.
        """
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
            "autocast_dtype": str(self.autocast_dtype).removeprefix("torch.") if self.autocast else None,
            "channels_last": self.channels_last,
            "compute_precision": self.compute_precision,
        }

    def __repr__(self) -> str:
        return f"Encoder(name={self.spec.name!r}, arch={self.spec.arch!r}, device={str(self.device)!r})"


def load_encoder(spec: EncoderSpec, device: str | torch.device | None = None, autocast: bool | None = None,
                 precision: str | None = None, channels_last: bool | str | None = None) -> Encoder:
    """Build the model of ``spec`` with its weights, frozen in eval mode on ``device``.

    Parameters
    ----------
    spec : EncoderSpec
        What to build.
    device : str or torch.device, optional
        CUDA when available, else CPU, by default.
    autocast : bool, optional
        float16 autocast on CUDA (never on the CPU); ignored when ``precision`` is given.
    precision : str, optional
        ``auto`` (float16 autocast on CUDA, float32 elsewhere), ``float32``, ``float16``
        or ``bfloat16`` (autocast on any device); None: ``autocast`` decides.
    channels_last : bool or "auto", optional
        Channels-last memory format; ``auto``/None: on CUDA for models with 2-D
        convolutions (never on the CPU, whose features stay bitwise as before).

    Returns
    -------
    Encoder
        The loaded encoder.

    Raises
    ------
    UnknownNameError
        Unknown architecture, pretrained tag or layer.
    CheckpointError
        The checkpoint is missing, unreadable or does not fit the architecture.
    HubUnavailableError
        Pretrained weights are not in the local cache.
    """
    check_architecture(spec)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    amp_dtype = autocast_dtype(precision, device, autocast)
    ckpt = checkpoint_path(spec) if spec.weights_kind == "checkpoint" else None
    kwargs = model_kwargs(spec)
    if spec.weights_kind == "pretrained":
        model = create_pretrained(spec, kwargs)
        info: dict[str, Any] = {"source": "timm-pretrained", "tag": spec.model_name}
        hub_id = (getattr(model, "pretrained_cfg", None) or {}).get("hf_hub_id")
        if hub_id:
            info["hf_hub_id"] = hub_id
    else:
        with INIT_LOCK:
            torch.manual_seed(spec.seed)
            model = create_model(spec, **kwargs)
        check_layer_names(spec, available_layers(model))  # before reading a possibly large checkpoint
        info = {"source": "random", "seed": spec.seed}
        if ckpt is not None:  # what was taken from the file and done to it, for provenance
            info = {"source": "checkpoint", "file": ckpt.name, **load_checkpoint_into(model, ckpt, spec).record()}
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
    fingerprint = weights_fingerprint(model)  # on CPU, before the move
    model.to(device)
    last = _has_conv2d(model) and device.type == "cuda" if channels_last in (None, "auto") else bool(channels_last)
    if last:
        model.to(memory_format=torch.channels_last)
    return Encoder(spec, model, device, fingerprint, amp_dtype, info, channels_last=last)


def meta_encoder(spec: EncoderSpec) -> Encoder | None:
    """``spec``'s encoder on the meta device: its data config and feature shapes, without
    reading weights or using memory (to size the evaluation of its features).

    Parameters
    ----------
    spec : EncoderSpec
        The encoder.

    Returns
    -------
    Encoder or None
        None when timm cannot build the model without the hub.
    """
    model = build_on_meta(spec)
    if model is None:
        return None
    model.eval()
    return Encoder(spec, model, torch.device("meta"), "", None, {})


def meta_feature_shapes(spec: EncoderSpec) -> dict[str, tuple[int, ...]] | None:
    """Shape of one image's features per layer of ``spec`` (:meth:`Encoder.feature_shapes`),
    from a forward pass on the meta device; None when timm cannot build it without the hub.

    Parameters
    ----------
    spec : EncoderSpec
        The encoder.

    Returns
    -------
    dict or None
    """
    encoder = meta_encoder(spec)
    return None if encoder is None else encoder.feature_shapes()


def meta_feature_dims(spec: EncoderSpec) -> dict[str, int] | None:
    """Feature width per layer of ``spec``, from a forward pass on the meta device.

    No weights are read and no memory is used: the widths are known before anything
    is extracted (to size the evaluation of those features).

    Parameters
    ----------
    spec : EncoderSpec
        The encoder.

    Returns
    -------
    dict or None
        Layer name -> width; None when timm cannot build the model without the hub.
    """
    shapes = meta_feature_shapes(spec)
    return None if shapes is None else {layer: shape[-1] for layer, shape in shapes.items()}


def _has_conv2d(model: nn.Module) -> bool:
    return any(isinstance(m, nn.Conv2d) for m in model.modules())


def _repeval_version() -> str:
    try:
        return metadata.version("repeval")
    except metadata.PackageNotFoundError:
        return "0.1.0"


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


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value

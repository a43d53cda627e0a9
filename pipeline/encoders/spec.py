"""What to build: an encoder's name, timm architecture, weights and layers."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.errors import ConfigError, unknown_name
from pipeline.names import validate_name

PRE_LOGITS = "pre_logits"
PRETRAINED_PREFIX = "timm:"
#: Suffix of a layer stored with its tokens, (n, T, d), instead of pooled: ``block11.tokens``.
TOKENS_SUFFIX = ".tokens"
#: The dtype token features are stored in, whatever the extraction's dtype (T times the pooled size).
TOKENS_DTYPE = "float16"
#: Suffix of a layer stored as a spatial map, (n, h, w, d), for dense readouts: ``block3.map``.
MAP_SUFFIX = ".map"
#: The dtype spatial maps are stored in (h x w times the pooled size), as token features.
MAP_DTYPE = "float16"
#: What a layer holds per image: one pooled vector, its tokens, or its spatial map.
LAYER_KINDS = ("pooled", "tokens", "map")
_BLOCK_RE = re.compile(r"^block(0|[1-9][0-9]*)$")


def is_token_layer(layer: str) -> bool:
    """Whether ``layer`` names a block's token features (``block<i>.tokens``)."""
    return layer.endswith(TOKENS_SUFFIX)


def is_map_layer(layer: str) -> bool:
    """Whether ``layer`` names a block's spatial map (``block<i>.map``)."""
    return layer.endswith(MAP_SUFFIX)


def layer_kind(layer: str) -> str:
    """What ``layer`` stores per image: ``pooled`` (d,), ``tokens`` (T, d) or ``map`` (h, w, d)."""
    return "tokens" if is_token_layer(layer) else "map" if is_map_layer(layer) else "pooled"


def base_layer(layer: str) -> str:
    """The block a layer name reads: ``block3`` for ``block3``, ``block3.tokens`` and ``block3.map``."""
    for suffix in (TOKENS_SUFFIX, MAP_SUFFIX):
        if layer.endswith(suffix):
            return layer[:-len(suffix)]
    return layer


def is_layer_name(layer: object) -> bool:
    """Whether ``layer`` is a layer name's grammar: ``pre_logits``, ``block<i>``,
    ``block<i>.tokens`` or ``block<i>.map`` (whether the model has it is another check)."""
    return isinstance(layer, str) and (layer == PRE_LOGITS or bool(_BLOCK_RE.match(base_layer(layer))))


def split_tag(arch: str) -> tuple[str, str]:
    """Split ``resnet50.a1_in1k`` into the architecture and its pretrained tag."""
    # The same rule as timm's model names: the tag is everything after the first dot.
    base, _, tag = arch.partition(".")
    return base, tag


@dataclass(frozen=True)
class EncoderSpec:
    """A named timm architecture, its weights and the layers to extract.

    Checked on construction: the name, the weights syntax, the layer syntax and the other
    fields' types. Whether timm knows the architecture is checked by
    :func:`check_architecture` (it imports timm).

    Parameters
    ----------
    name : str
        The encoder's name in the store and in every table.
    arch : str
        A timm architecture (``resnet50``, optionally with a pretrained tag).
    weights : str
        ``"random"`` (seeded init), a local checkpoint path (.safetensors, .pth, .pt,
        .bin, .ckpt, .pth.tar, .tar), ``"pretrained"`` (timm's default tag) or ``"timm:<tag>"``; the last two
        only from the local hub cache.
    seed : int
        Seed of the random initialisation (also of the tensors a checkpoint lacks).
    layers : tuple of str
        ``pre_logits`` and/or ``block<i>`` (the i-th output of timm's
        ``forward_intermediates``, pooled to one vector per image) and/or
        ``block<i>.tokens`` (that output's tokens, (T, d) per image, stored as float16)
        and/or ``block<i>.map`` (that output as a spatial map, (h, w, d) per image, float16).
    input_size : int, optional
        Square input resolution overriding the model's default (ViTs are built for it).
    strip_prefixes : tuple of str
        Key prefix parts tried besides the usual ones (``module.``, ``backbone.``,
        ``encoder_q.``, ...: :data:`pipeline.encoders.checkpoints.fitting.PREFIX_PARTS`) when a
        checkpoint's tensor names are matched to the architecture.
    checkpoint_key : str, optional
        Where a checkpoint holding several state dicts keeps the weights (``teacher``,
        ``state_dict_ema``; nested keys joined with ``/``); None: found from the architecture.
    """

    name: str
    arch: str
    weights: str = "random"
    seed: int = 0
    layers: tuple[str, ...] = (PRE_LOGITS,)
    input_size: int | None = None
    strip_prefixes: tuple[str, ...] = ()
    checkpoint_key: str | None = None

    def __post_init__(self) -> None:
        validate_name(self.name, "encoder name")
        for field in ("layers", "strip_prefixes"):
            if isinstance(getattr(self, field), str):
                raise ConfigError(f"{field} must be a sequence of strings, got the string {getattr(self, field)!r}")
        # Lists from JSON/YAML become tuples so the spec stays hashable.
        object.__setattr__(self, "layers", tuple(self.layers))
        object.__setattr__(self, "strip_prefixes", tuple(self.strip_prefixes))
        if not isinstance(self.arch, str) or not split_tag(self.arch)[0]:
            raise ConfigError(f"encoder {self.name!r}: arch must name a timm architecture, got {self.arch!r}")
        self._check_weights()
        if self.checkpoint_key is not None and (not isinstance(self.checkpoint_key, str) or not self.checkpoint_key):
            raise ConfigError(f"encoder {self.name!r}: checkpoint_key must be a key of the checkpoint (e.g. "
                              f"'teacher') or None, got {self.checkpoint_key!r}")
        if not all(isinstance(p, str) and p.endswith(".") for p in self.strip_prefixes):
            raise ConfigError(f"encoder {self.name!r}: strip_prefixes entries are name prefixes ending in '.', "
                              f"e.g. ['net.'], got {list(self.strip_prefixes)}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"seed must be an int, got {self.seed!r}")
        if self.input_size is not None and (
            isinstance(self.input_size, bool) or not isinstance(self.input_size, int) or self.input_size <= 0
        ):
            raise ConfigError(f"input_size must be a positive int or None, got {self.input_size!r}")
        self._check_layers()

    def _check_weights(self) -> None:
        if not isinstance(self.weights, str) or not self.weights:
            raise ConfigError(
                f"weights must be 'random', 'pretrained', 'timm:<tag>' or a checkpoint path, got {self.weights!r}"
            )
        if self.weights == PRETRAINED_PREFIX:
            raise ConfigError(f"weights {self.weights!r} names no tag; use 'pretrained' or 'timm:<tag>'")
        arch_tag = split_tag(self.arch)[1]
        other_tag = self.weights != f"{PRETRAINED_PREFIX}{arch_tag}"
        if self.weights.startswith(PRETRAINED_PREFIX) and arch_tag and other_tag:
            raise ConfigError(
                f"arch {self.arch!r} already names tag {arch_tag!r}; weights {self.weights!r} asks for another"
            )

    def _check_layers(self) -> None:
        if not self.layers:
            raise ConfigError(f"encoder {self.name!r}: layers must not be empty; e.g. ({PRE_LOGITS!r},)")
        bad = [layer for layer in self.layers if not is_layer_name(layer)]
        if bad:  # every one at once
            what = f"layer {bad[0]!r} is" if len(bad) == 1 else f"layers {', '.join(repr(b) for b in bad)} are"
            raise ConfigError(
                f"encoder {self.name!r}: {what} not {PRE_LOGITS!r}, 'block<i>' (e.g. 'block3'), "
                f"'block<i>{TOKENS_SUFFIX}' (that block's tokens) or 'block<i>{MAP_SUFFIX}' (its spatial map)"
            )
        if len(set(self.layers)) != len(self.layers):
            raise ConfigError(f"encoder {self.name!r}: duplicate layers in {list(self.layers)}")

    @property
    def weights_kind(self) -> str:
        """One of ``random``, ``pretrained`` or ``checkpoint``."""
        if self.weights == "random":
            return "random"
        if self.weights == "pretrained" or self.weights.startswith(PRETRAINED_PREFIX):
            return "pretrained"
        return "checkpoint"

    @property
    def model_name(self) -> str:
        """The name timm builds: the architecture, with the pretrained tag of ``timm:<tag>``."""
        if self.weights.startswith(PRETRAINED_PREFIX):
            return f"{split_tag(self.arch)[0]}.{self.weights[len(PRETRAINED_PREFIX):]}"
        return self.arch

    @classmethod
    def from_fields(cls, entry: Any) -> EncoderSpec:
        """The spec of an object that carries the spec's fields as attributes: the one
        conversion from a config's encoder entry (``jobs.config.EncoderConfig``, which adds
        fields of its own) to the spec.

        Parameters
        ----------
        entry : object
            Has an attribute per field of this class (lists are taken for tuples).

        Returns
        -------
        EncoderSpec
            The spec, checked.
        """
        return cls(**{f.name: getattr(entry, f.name) for f in dataclasses.fields(cls)})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EncoderSpec:
        """Inverse of ``to_plain(spec)``; unknown keys are an error, not ignored (the
        pipeline layer cannot use ``jobs.config.typed.from_plain``).

        Parameters
        ----------
        data : mapping
            Field values by name.

        Returns
        -------
        EncoderSpec
            The spec.
        """
        fields = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise ConfigError(f"Unknown EncoderSpec field(s) {unknown}; valid fields: {', '.join(fields)}")
        return cls(**data)


def _timm():
    """timm, imported on first use (it imports torch and torchvision: seconds)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no network: weights come from the local cache
    import timm

    return timm


def check_architecture(spec: EncoderSpec) -> None:
    """Raise UnknownNameError, with close valid names, unless timm knows ``spec.arch``.

    Parameters
    ----------
    spec : EncoderSpec
        The spec to check.
    """
    timm = _timm()
    if not timm.is_model(split_tag(spec.arch)[0]):
        raise unknown_name("timm architecture", spec.arch, timm.list_models())


def list_architectures(pattern: str = "*") -> list[str]:
    """Names of timm architectures matching a glob pattern.

    Parameters
    ----------
    pattern : str
        A glob pattern such as ``resnet*``.

    Returns
    -------
    list of str
        The matching names, sorted.
    """
    return _timm().list_models(pattern)

"""The encoders of a run: ``encoders:`` entries, and ``checkpoints:`` folders whose files
become encoders (``jobs.config.checkpoint_folders`` scans them); the weights an encoder
names, checked before any work, one line per problem."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from jobs.config.run import DTYPES, ExtractConfig
from jobs.config.typed import check_name
from pipeline.analysis.series.steps import compile_step_pattern
from pipeline.encoders.spec import PRE_LOGITS, EncoderSpec, is_layer_name
from pipeline.errors import ConfigError

__all__ = [
    "ENCODER_SOURCES", "CheckpointScan", "EncoderConfig", "check_checkpoint_fields", "check_encoder", "check_weights",
    "layer_shorthands",
]

ENCODER_SOURCES = ("extract", "store")  # features computed by the run, or already in the store


def layer_shorthands(data: dict, path: str) -> dict:
    """``layers`` entries may be mappings, ``{layer: block11, tokens: true}``: that block's
    token features (n, T, d) rather than pooled ones, i.e. the layer ``block11.tokens``.

    Parameters
    ----------
    data : dict
        An ``encoders:`` or ``checkpoints:`` entry as read from YAML.
    path : str
        Where the entry sits in the config, for the messages.

    Returns
    -------
    dict
        ``data`` with each mapping of ``layers`` turned into its layer name.
    """
    layers = data.get("layers")
    if not isinstance(layers, list) or not any(isinstance(v, dict) for v in layers):
        return data
    names = []
    for i, entry in enumerate(layers):
        if not isinstance(entry, dict):
            names.append(entry)
            continue
        unknown = sorted(set(entry) - {"layer", "tokens"})
        if unknown or not isinstance(entry.get("layer"), str) or not isinstance(entry.get("tokens", False), bool):
            raise ConfigError(f"{path}.layers[{i}]: {entry!r}; a layer is a name (e.g. block3) or a mapping "
                              "{layer: <name>, tokens: true|false}")
        names.append(entry["layer"] + (".tokens" if entry.get("tokens") else ""))
    return {**data, "layers": names}


@dataclass
class EncoderConfig:
    """The config's fields of one encoder; :meth:`spec` builds the ``EncoderSpec`` that
    loads it (kept apart so that reading a config never imports torch or timm).

    The fields from ``name`` to ``checkpoint_key`` are ``EncoderSpec``'s, by name (lists
    here for its tuples, ``arch`` optional for ``source: store``); ``EncoderSpec.from_fields``
    is the one conversion, and a test holds the two field lists together.

    ``dtype`` stores this encoder's features as float16 or float32 whatever
    ``extract.dtype`` says. ``source: store`` names features already in the store
    (``repeval import-features``): they are evaluated, never extracted, and ``arch``,
    ``weights`` and the rest are not needed.

    Parameters
    ----------
    name : str
        The encoder's name in the store and the report.
    arch : str
        The timm architecture (optional for ``source: store``).
    weights : str
        ``random``, ``pretrained`` (timm's, from the local cache) or a checkpoint file.
    seed : int
        The seed of random weights.
    layers : list of str
        The layers to extract (``pre_logits``, ``block<i>``, ``block<i>.tokens``, ``block<i>.map``).
    input_size : int or None
        The input resolution (None: the architecture's).
    strip_prefixes, checkpoint_key : list of str, str or None
        Where a checkpoint keeps the weights, when it is not found alone (docs/checkpoints.md).
    dtype : str or None
        The stored dtype of this encoder's features (None: ``extract.dtype``).
    source : str
        ``extract`` or ``store`` (features already in the store: evaluated, never extracted).
    series, step : str or None, int or None
        The checkpoint series it belongs to and its training step there.
    """

    name: str
    arch: str = ""
    weights: str = "random"
    seed: int = 0
    layers: list[str] = field(default_factory=lambda: ["pre_logits"])
    input_size: int | None = None
    strip_prefixes: list[str] = field(default_factory=list)  # prefix parts tried besides the usual ones
    checkpoint_key: str | None = None  # where a checkpoint holding several state dicts keeps the weights
    dtype: str | None = None  # None: extract.dtype
    source: str = "extract"
    series: str | None = None  # a checkpoint series this encoder belongs to (set by a scan, or given)
    step: int | None = None  # its training step in that series

    @staticmethod
    def prepare_plain(data: dict, path: str) -> dict:
        """Read the ``layers`` shorthands (``{layer: block11, tokens: true}``) before typing.

        Parameters
        ----------
        data : dict
            The entry as read from YAML, before typing.
        path : str
            Where the entry sits in the config, for the messages.

        Returns
        -------
        dict
            ``data`` with the shorthands expanded.
        """
        return layer_shorthands(data, path)

    def check(self, path: str) -> None:
        """Refuse bad names, steps, sources, dtypes and checkpoint fields, naming the field.

        Parameters
        ----------
        path : str
            Where the entry sits in the config (``encoders[0]``), for the messages.
        """
        check_name(self.name, f"{path}.name")
        for i, layer in enumerate(self.layers):
            check_name(layer, f"{path}.layers[{i}]")
        if self.step is not None and (isinstance(self.step, bool) or self.step < 0):
            raise ConfigError(f"{path}.step: {self.step!r} must be a training step >= 0")
        if self.series is not None and not self.series.strip():
            raise ConfigError(f"{path}.series: must not be empty")
        if self.source not in ENCODER_SOURCES:
            raise ConfigError(f"{path}.source: {self.source!r} is not one of {', '.join(ENCODER_SOURCES)}")
        if self.source == "extract" and not self.arch.strip():
            raise ConfigError(f"{path}.arch: missing; give the timm architecture (e.g. resnet50), or "
                              "source: store for features already in the store")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ConfigError(f"{path}.dtype: {self.dtype!r} is not supported; choose one of {', '.join(DTYPES)}")
        check_checkpoint_fields(self, path)

    @property
    def extracted(self) -> bool:
        """Whether a run extracts these features (False: they are read from the store)."""
        return self.source == "extract"

    def extract_settings(self, extract: ExtractConfig) -> ExtractConfig:
        """``extract`` with this encoder's own ``dtype`` where it has one.

        Parameters
        ----------
        extract : ExtractConfig
            The config's ``extract:`` section.

        Returns
        -------
        ExtractConfig
        """
        return extract if self.dtype is None else dataclasses.replace(extract, dtype=self.dtype)

    def spec(self) -> EncoderSpec:
        """The ``EncoderSpec`` that loads this encoder (checked as the spec checks itself).

        Returns
        -------
        EncoderSpec
        """
        return EncoderSpec.from_fields(self)


@dataclass
class CheckpointScan:
    """A folder of checkpoints of one architecture; each new file becomes an encoder of
    one series, at the training step its name or metadata gives.

    Parameters
    ----------
    path : str
        The folder.
    arch : str
        The timm architecture of every file.
    pattern : str
        The file names taken (a glob).
    layers, input_size, checkpoint_key, strip_prefixes
        As an encoder's, for every file.
    name_prefix : str
        Put before each file's name to make its encoder's name.
    settle_seconds : float
        How long a file must stay unchanged before it is taken.
    done_suffix : str or None
        With it, a file is taken only once ``<file name><done_suffix>`` exists.
    series : str or None
        The series' name (None: the folder's).
    step_pattern : str or None
        Where a file name holds its step (``"step{step}"`` or a regex with a group ``step``);
        None: the name's digits, else the file's metadata.
    """

    path: str
    arch: str
    pattern: str = "*.safetensors"
    layers: list[str] = field(default_factory=lambda: ["pre_logits"])
    input_size: int | None = None
    name_prefix: str = ""
    settle_seconds: float = 30.0
    done_suffix: str | None = None
    series: str | None = None
    step_pattern: str | None = None
    checkpoint_key: str | None = None  # as an encoder's, for every file of the folder
    strip_prefixes: list[str] = field(default_factory=list)

    @staticmethod
    def prepare_plain(data: dict, path: str) -> dict:
        """Read the ``layers`` shorthands, as an encoder's.

        Parameters
        ----------
        data : dict
            The entry as read from YAML, before typing.
        path : str
            Where the entry sits in the config, for the messages.

        Returns
        -------
        dict
            ``data`` with the shorthands expanded.
        """
        return layer_shorthands(data, path)

    def check(self, path: str) -> None:
        """Refuse an empty path or pattern, a bad series, step pattern, settle time or suffix.

        Parameters
        ----------
        path : str
            Where the entry sits in the config (``encoders[0]``), for the messages.
        """
        if not self.path.strip() or not self.pattern.strip():
            raise ConfigError(f"{path}: path and pattern must not be empty")
        if self.series is not None and not self.series.strip():
            raise ConfigError(f"{path}.series: must not be empty (leave it out to name the series after the folder)")
        if self.step_pattern is not None:
            try:
                compile_step_pattern(self.step_pattern)
            except ConfigError as exc:
                raise ConfigError(f"{path}.step_pattern: {exc}") from None
        if self.settle_seconds < 0:
            raise ConfigError(f"{path}.settle_seconds: {self.settle_seconds} must be >= 0")
        if self.done_suffix is not None and (not self.done_suffix.strip() or "/" in self.done_suffix):
            raise ConfigError(f"{path}.done_suffix: {self.done_suffix!r} must be a file name suffix such as '.done'")
        for i, layer in enumerate(self.layers):
            check_name(layer, f"{path}.layers[{i}]")
        check_checkpoint_fields(self, path)


# -- the weights an encoder names, checked before any work ----------------------------------
def check_weights(spec: Any) -> None:
    """Raise a one-line error when ``spec``'s weights cannot be used; random weights pass."""
    if spec.weights_kind == "checkpoint":
        # deferred: torch reads the checkpoint when the plan checks it; reading a config needs neither torch
        # nor timm
        from pipeline.encoders import check_checkpoint_fits

        check_checkpoint_fits(spec)
    elif spec.weights_kind == "pretrained":
        # deferred: timm, as above
        from pipeline.encoders.hub import check_pretrained_available

        check_pretrained_available(spec)


def check_encoder(encoder: Any) -> None:
    """Architecture, layers and weights of one encoder config (timm on the meta device, the
    checkpoint's header); raises the RepevalError that says what is wrong."""
    # deferred: timm and torch load when an encoder is checked (a full plan), never for a rerun answered from
    # the ledger
    from pipeline.encoders import check_layers_available
    from pipeline.encoders.building import check_requested_layers

    if not all(is_layer_name(layer) for layer in encoder.layers):  # every bad layer at once, with the range
        check_requested_layers(dataclasses.replace(encoder, layers=[PRE_LOGITS]).spec(), encoder.layers)
    spec = encoder.spec()
    check_layers_available(spec)
    check_weights(spec)


def check_checkpoint_fields(entry: Any, path: str) -> None:
    """``checkpoint_key`` names a key (``teacher``); ``strip_prefixes`` holds name prefixes
    ending in a dot (``net.``), tried besides the usual ones (docs/checkpoints.md)."""
    if entry.checkpoint_key is not None and not entry.checkpoint_key.strip():
        raise ConfigError(f"{path}.checkpoint_key: must not be empty; give the key holding the weights "
                          "(e.g. teacher), or leave it out to find it")
    bad = [p for p in entry.strip_prefixes if not p.endswith(".") or p.strip() != p or p == "."]
    if bad:
        raise ConfigError(f"{path}.strip_prefixes: {bad[0]!r} is not a name prefix ending in '.' "
                          "(e.g. [net.])")

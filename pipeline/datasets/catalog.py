"""The registered dataset adapters with their parameters and defaults (``repeval datasets``)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from pipeline.datasets import adapter_class, list_datasets

__all__ = ["REQUIRED", "AdapterParameter", "adapter_listing", "adapter_parameters", "adapter_record", "path_parameters"]

#: The default shown for a parameter that has none.
REQUIRED = "(required)"


@dataclass(frozen=True)
class AdapterParameter:
    """One constructor parameter of an adapter."""

    name: str
    default: Any

    @property
    def required(self) -> bool:
        """Whether a config must give it."""
        return self.default is REQUIRED


def adapter_parameters(adapter: str, include_name: bool = False) -> list[AdapterParameter]:
    """The constructor parameters of adapter ``adapter``, in their order."""
    signature = inspect.signature(adapter_class(adapter).__init__)
    return [AdapterParameter(p.name, REQUIRED if p.default is inspect.Parameter.empty else p.default)
            for p in signature.parameters.values()
            if p.name not in ("self", *(() if include_name else ("name",)))
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def path_parameters(adapter: str) -> tuple[str, ...]:
    """The parameters of ``adapter`` that name a file or folder (annotated ``os.PathLike``)."""
    # A config resolves their relative values against its own folder.
    if adapter not in list_datasets():
        return ()
    signature = inspect.signature(adapter_class(adapter).__init__)
    return tuple(p.name for p in signature.parameters.values() if "PathLike" in str(p.annotation))


def _default_text(value: Any) -> str:
    if value is REQUIRED:
        return value
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return repr(value) if isinstance(value, str) else str(value)


def adapter_record(adapter: str) -> dict[str, Any]:
    """One adapter as JSON-able data (``repeval datasets --json``)."""
    cls = adapter_class(adapter)
    return {"adapter": adapter, "metric": cls.metric, "multi_label": bool(cls.multi_label),
            "images": bool(cls.has_images),
            "splits": {"train": cls.train_split, "val": cls.val_split, "test": cls.test_split,
                       "pooled": cls.pooled_split},
            "parameters": [{"name": p.name, "default": None if p.required else p.default, "required": p.required}
                           for p in adapter_parameters(adapter)]}


def adapter_listing() -> str:
    """Every registered adapter: metric, splits, and parameters with their defaults."""
    blocks = []
    for adapter in list_datasets():
        cls = adapter_class(adapter)
        kind = ", multi-label" if cls.multi_label else "" if cls.has_images else ", precomputed features"
        kind += f", per-pixel {cls.dense_task} targets" if cls.dense_task else ""
        held_out = {"segmentation": "a share of train drawn by the protocol", "normals": "none"}.get(
            cls.dense_task, "20 % of train")
        roles = f"train {cls.train_split!r}, validation " + (repr(cls.val_split) if cls.val_split else held_out)
        roles += f", test {cls.test_split!r}" + (f", pooled {cls.pooled_split!r}" if cls.pooled_split else "")
        params = ", ".join(p.name + (" (required)" if p.required else f"={_default_text(p.default)}")
                           for p in adapter_parameters(adapter))
        blocks.append(f"{adapter}: metric {cls.metric}{kind}; {roles}\n  parameters: {params}")
    return "\n".join(blocks) + ("\n\nparameters go under a dataset's params: in a config; "
                                "repeval datasets show ADAPTER --param root=... reads a copy and prints its "
                                "splits, counts and fingerprint")

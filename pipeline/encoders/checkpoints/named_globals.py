"""Whether the globals a checkpoint's pickle names are those of a plain state dict."""

from __future__ import annotations

import torch

from pipeline.encoders.checkpoints.storage_sizes import Global

#: What a plain state dict's pickle names besides storages and dtypes: rebuilding a tensor or a
#: parameter from its bytes, and the containers torch's safe loader builds itself.
_STATE_DICT_GLOBALS = frozenset({
    "torch._utils._rebuild_tensor", "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_parameter",
    "torch._utils._rebuild_parameter_with_state", "torch.Size", "torch.device", "collections.OrderedDict",
    "builtins.set", "builtins.frozenset", "builtins.bytearray", "builtins.complex",
})


def _plain_global(module: str, name: str) -> bool:
    """Whether a global names a storage type or dtype of torch's, or one of ``_STATE_DICT_GLOBALS``."""
    if f"{module}.{name}" in _STATE_DICT_GLOBALS:
        return True
    if module not in ("torch", "torch.storage") or name.startswith("_"):
        return False
    value = getattr(torch, name, None)
    return isinstance(value, torch.dtype) or (isinstance(value, type) and name.endswith("Storage"))


def _registered_safe_globals() -> set[str]:
    """The names registered with torch.serialization.add_safe_globals (this module's stand-ins among them)."""
    names = set()
    for entry in torch.serialization.get_safe_globals():
        if isinstance(entry, tuple):  # (object, the name a file gives it)
            names.add(entry[1])
        else:
            names.add(f"{getattr(entry, '__module__', '')}.{getattr(entry, '__qualname__', entry)}")
    return names


def globals_naming_code(named: frozenset[Global] | None) -> list[str] | None:
    """The globals among ``named`` that name code: neither a plain state dict's nor registered as safe."""
    if named is None:
        return None
    registered = _registered_safe_globals()
    return sorted(f"{g.module}.{g.name}" for g in named
                  if not _plain_global(g.module, g.name) and f"{g.module}.{g.name}" not in registered)

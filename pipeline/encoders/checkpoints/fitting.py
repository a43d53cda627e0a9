"""Fitting what a checkpoint holds to an architecture: which mapping, which prefix, what to drop."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from pipeline.encoders.checkpoints.reading import USUAL_KEYS, location_label, tensor_mappings
from pipeline.errors import CheckpointError
from pipeline.terminal import SHORT_LIMIT, printable, short

#: Prefix parts tried in any combination (``module.backbone.``, ``model.encoder.`` ...).
PREFIX_PARTS = ("module.", "model.", "_orig_mod.", "backbone.", "encoder.", "encoder_q.", "base_encoder.",
                "online_network.", "student.", "teacher.", "trunk.", "visual.", "net.", "network.", "image_encoder.")
_WRAPPERS = ("module.", "model.", "_orig_mod.")  # parts that wrap a whole model, not a part of one
_MAX_LISTED = 10
_EXAMPLES = 5


@dataclass(frozen=True)
class KeyMismatch:
    """How a checkpoint's tensors differ from a model's."""

    missing: list[str]
    unexpected: list[str]
    mismatched: list[str]
    dropped: frozenset[str]

    def __bool__(self) -> bool:
        return bool(self.missing or self.unexpected or self.mismatched)

    def summary(self, limit: int = _MAX_LISTED) -> str:
        """The differences, each kind with its count and first ``limit`` names."""
        parts = []
        for what, names in (("missing keys", self.missing), ("unexpected keys", self.unexpected),
                            ("shape mismatches", self.mismatched)):
            if names:
                more = f", ... ({len(names) - limit} more)" if len(names) > limit else ""
                parts.append(f"{len(names)} {what}: {', '.join(_shown(n) for n in names[:limit])}{more}")
        return "; ".join(parts)


def _shown(name: str) -> str:
    """A name from a file as a message shows it, unquoted: at most ``SHORT_LIMIT`` characters."""
    return printable(name if len(name) <= SHORT_LIMIT else name[:SHORT_LIMIT - 3] + "...")


def classifier_prefixes(model: nn.Module) -> tuple[str, ...]:
    """Key prefixes of the model's classifier head (``fc.``, ``head.``), from timm's config."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    names = cfg.get("classifier") or ()
    names = (names,) if isinstance(names, str) else tuple(names)
    return tuple(f"{n}." for n in names)


def compare(shapes: Mapping[str, tuple[int, ...]], model: nn.Module) -> KeyMismatch:
    """Compare a checkpoint's tensor shapes with a model's."""
    # A checkpoint tensor the model lacks is dropped when it belongs to the classifier head
    # or to a part the backbone does not have (its first name component is none of the
    # model's modules or tensors); inside one of the backbone's modules it is unexpected.
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    heads = classifier_prefixes(model)
    own = {n for n, _ in model.named_children()} | {n for n, _ in model.named_parameters(recurse=False)} | {
        n for n, _ in model.named_buffers(recurse=False)}
    extra = set(shapes) - set(expected)
    dropped = frozenset(k for k in extra if any(k.startswith(h) for h in heads) or k.split(".", 1)[0] not in own)
    unexpected = sorted(extra - dropped)
    # num_batches_tracked only counts training steps; eval-mode BN never reads it.
    missing = sorted(k for k in set(expected) - set(shapes) if not k.endswith("num_batches_tracked"))
    mismatched = sorted(
        f"{k} (checkpoint {tuple(shapes[k])}, model {expected[k]})"
        for k in set(shapes) & set(expected)
        if tuple(shapes[k]) != expected[k]
    )
    return KeyMismatch(missing, unexpected, mismatched, dropped)


@dataclass
class CheckpointFit:
    """What was taken from a checkpoint for a model, and what was done to it."""

    state: dict[str, Tensor]
    location: str
    given: bool
    prefix: str
    dropped: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)
    resampled: list[dict[str, Any]] = field(default_factory=list)
    converted_by: str | None = None
    also_fits: list[str] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        """JSON-able account for provenance."""
        out: dict[str, Any] = {
            "checkpoint_key": self.location or None, "checkpoint_key_from": "config" if self.given else "found",
            "prefix_stripped": self.prefix or None,
            "dropped": {"count": sum(self.dropped.values()), "groups": dict(self.dropped),
                        "examples": list(self.examples)},
            "resampled": list(self.resampled), "converted_by": self.converted_by,
        }
        if self.also_fits:
            out["also_fits"] = list(self.also_fits)
        return out


def _composed(prefix: str, parts: tuple[str, ...], cache: dict[str, bool]) -> bool:
    # positions reached, not suffixes: a 16 MiB prefix of "module." would recurse and cache every suffix
    if prefix not in cache:
        reached, todo = {0}, [0]
        while todo and len(prefix) not in reached:
            pos = todo.pop()
            for p in parts:
                if p and prefix.startswith(p, pos) and pos + len(p) not in reached:
                    reached.add(pos + len(p))
                    todo.append(pos + len(p))
        cache[prefix] = len(prefix) in reached
    return cache[prefix]


def prefix_counts(names: list[str], expected: set[str]) -> dict[str, int]:
    """For every prefix ending at a dot: how many of ``expected`` it turns ``names`` into."""
    counts: dict[str, int] = {}
    longest = max(map(len, expected), default=0)
    for name in names:
        # only cuts that leave at most the longest model name: a file's key may be 16 MiB of dots
        first = max(len(name) - longest - 1, 0)
        for cut in [0] + [first + i + 1 for i, ch in enumerate(name[first:]) if ch == "."]:
            if name[cut:] in expected:
                counts[name[:cut]] = counts.get(name[:cut], 0) + 1
    return counts


def _group(name: str) -> str:
    """The part of a name that says what it belongs to: ``module.encoder_k.``, ``fc.``."""
    pos = 0  # the wrappers' length: indices, not slices (a key may be 16 MiB of "module.")
    while True:
        wrapper = next((w for w in _WRAPPERS if name.startswith(w, pos)), None)
        if wrapper is None or name.find(".", 2 * pos) < 0:
            break
        pos += len(wrapper)
    end = name.find(".", pos)
    return name if end < 0 else name[:end + 1]


@dataclass
class _Candidate:
    location: str
    prefix: str
    matched: int
    fit: CheckpointFit | None
    problem: str  # why it does not fit ("" when it does)
    hint: str
    shapes: dict[str, tuple[int, ...]]  # of the tensors under the prefix (to name the architecture they fit)


def _try(location: str, tensors: dict[str, Tensor], model: nn.Module, extra_parts: tuple[str, ...],
         given: bool) -> _Candidate:
    expected_shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    counts = prefix_counts(list(tensors), set(expected_shapes))
    parts = tuple(dict.fromkeys(PREFIX_PARTS + extra_parts))
    cache: dict[str, bool] = {}
    usable = {p: n for p, n in counts.items() if _composed(p, parts, cache)}
    prefix = max(usable, key=lambda p: (usable[p], -len(p))) if usable else ""
    matched = usable.get(prefix, 0)
    hint = ""
    best_any = max(counts, key=lambda p: (counts[p], -len(p))) if counts else ""
    if counts.get(best_any, 0) > matched:
        hint = (f"; its tensors match under prefix {short(best_any)}: set `strip_prefixes: [{_shown(best_any)}]` "
                f"(repeval extract: --strip-prefixes {_shown(best_any)})")
    inside = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    dropped: dict[str, int] = {}
    examples: list[str] = []

    def drop(names: list[str], base: str = "") -> None:
        for name in names:
            group = base + _group(name)
            if group not in dropped and len(examples) < _EXAMPLES:  # one name of each kind
                examples.append(base + name)
            dropped[group] = dropped.get(group, 0) + 1

    drop([k for k in tensors if not k.startswith(prefix)])
    mismatch = compare({k: tuple(v.shape) for k, v in inside.items()}, model)
    drop(sorted(mismatch.dropped), prefix)
    state = {k: v for k, v in inside.items() if k not in mismatch.dropped}
    converted, resampled = None, []
    if mismatch.mismatched or mismatch.missing:
        # the backbone's own tensors first (a decoder's mask_token must not pick a converter);
        # then everything under the prefix, then the file's own names (a converter may need them)
        for given_state in (state, inside, tensors) if prefix else (state, inside):
            filtered = _timm_filter(given_state, model)
            if filtered is None:
                continue
            again = compare({k: tuple(v.shape) for k, v in filtered[0].items()}, model)
            if len(again.mismatched) + len(again.missing) < len(mismatch.mismatched) + len(mismatch.missing):
                converted = filtered[1]
                resampled = [{"tensor": k, "from": list(given_state[k].shape), "to": list(v.shape)}
                             for k, v in filtered[0].items()
                             if k in given_state and tuple(given_state[k].shape) != tuple(v.shape)]
                state = {k: v for k, v in filtered[0].items() if k not in again.dropped}
                mismatch = again
            if not mismatch:
                break
    problem = mismatch.summary(limit=3) if mismatch else ""
    fit = None if mismatch else CheckpointFit(state, location, given, prefix, dropped, examples, resampled, converted)
    shapes = {k: tuple(v.shape) for k, v in inside.items()}
    return _Candidate(location, prefix, matched, fit, problem, hint, shapes)


def _advice(cand: _Candidate, model: nn.Module, guess: Callable[[dict], str | None] | None, arch: str,
            n_tensors: int) -> str:
    looks = guess(cand.shapes) if guess is not None and cand.matched else None
    if looks:
        return f"; it looks like {looks}: set `arch: {looks}`"
    if "shape mismatches" in cand.problem and "missing keys" not in cand.problem:
        return _shape_advice(cand.problem, model)
    if cand.hint:  # the names match under a prefix of other parts: the hint says which line
        return ""
    if not cand.matched:
        return f"; none of its {n_tensors} tensors has a name {arch} has: a file of another architecture? check `arch:`"
    if "shape mismatches" in cand.problem:
        return "; its tensors are of another architecture: check `arch:`"
    return ""


def _shape_advice(problem: str, model: nn.Module) -> str:
    if "pos_embed" in problem or "relative_position" in problem:
        has = getattr(sys.modules.get(type(model).__module__), "checkpoint_filter_fn", None) is not None
        why = "timm's converter could not resample it" if has else f"timm ships no converter for {type(model).__name__}"
        return (f"; the checkpoint was trained at another input size and {why}: set `input_size:` to its "
                "training size, or leave it unset")
    return "; the checkpoint is of another width (check `arch:`)"


def _timm_filter(state: dict[str, Tensor], model: nn.Module) -> tuple[dict[str, Tensor], str] | None:
    """timm's own ``checkpoint_filter_fn`` of the model's module applied to ``state`` (it
    resamples position embeddings to the model's grid and converts original naming)."""
    module = type(model).__module__
    fn = getattr(sys.modules.get(module), "checkpoint_filter_fn", None)
    if fn is None:
        return None
    try:
        return dict(fn(dict(state), model)), f"{module}.checkpoint_filter_fn"
    except Exception:  # noqa: BLE001  a converter meant for other files: the mismatch stands as it was
        return None


def _usual_rank(location: str) -> tuple[int, ...]:
    return tuple(USUAL_KEYS.index(p) if p in USUAL_KEYS else len(USUAL_KEYS) for p in location.split("/") if p)


def _usual(location: str) -> bool:
    return location == "" or all(part in USUAL_KEYS for part in location.split("/"))


def fit_checkpoint(raw: object, model: nn.Module, name: str, arch: str, checkpoint_key: str | None = None,
                   strip_prefixes: tuple[str, ...] = (),
                   guess: Callable[[dict], str | None] | None = None) -> CheckpointFit:
    """Find the weights of ``model`` in what a checkpoint file holds."""
    found = tensor_mappings(raw)
    n_model = len(model.state_dict())

    def listing(cands: list[_Candidate]) -> str:
        return ", ".join(f"{location_label(c.location)} ({c.matched} of {n_model} tensors of {arch}"
                         + (f" under prefix {short(c.prefix)}" if c.prefix else "") + ")" for c in cands[:8])

    if not found:
        raise CheckpointError(f"{name!r} holds no tensors under string names: not a state dict")
    if checkpoint_key is not None:
        if checkpoint_key not in found:
            everything = [_try(w, t, model, strip_prefixes, False) for w, t in found.items()]
            raise CheckpointError(f"{name!r} has no tensors under checkpoint_key {short(checkpoint_key)}; it holds "
                                  f"tensors at: {listing(everything)}")
        cand = _try(checkpoint_key, found[checkpoint_key], model, strip_prefixes, True)
        if cand.fit is None:
            raise CheckpointError(f"{name!r} under {short(checkpoint_key)} does not fit {arch}: {cand.problem}"
                                  f"{_advice(cand, model, guess, arch, len(found[checkpoint_key]))}{cand.hint}")
        return cand.fit
    cands = [_try(w, t, model, strip_prefixes, False) for w, t in found.items()]
    fitting = [c for c in cands if c.fit is not None]
    usual = [c for c in fitting if _usual(c.location)]
    chosen = usual if usual else fitting
    if len(chosen) == 1:
        fit = chosen[0].fit
        fit.also_fits = [c.location for c in fitting if c is not chosen[0]]
        return fit
    if len(chosen) > 1:
        # the line offered names the usual first choice (DINO writes its student first, but the
        # teacher is the one evaluated; timm's state_dict before its EMA), whatever the file's order
        key = _shown(min(chosen, key=lambda c: _usual_rank(c.location)).location)
        raise CheckpointError(f"{name!r} holds several state dicts that fit {arch}: {listing(chosen)}; say which "
                              f"with `checkpoint_key: {key}` (repeval extract: --checkpoint-key {key})")
    best = max(cands, key=lambda c: c.matched)
    others = [c for c in cands if c is not best]
    where = f" (under {short(best.location)})" if best.location else ""
    also = f"; it also holds tensors at: {listing(others)}" if others else ""
    advice = _advice(best, model, guess, arch, len(found[best.location]))
    raise CheckpointError(f"{name!r}{where} does not fit {arch}: {best.problem}{advice}{best.hint}{also}")

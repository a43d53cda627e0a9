"""Whether two cells' evidence can be paired: their fingerprints must agree."""

from __future__ import annotations

from pipeline.errors import DataValidationError
from pipeline.protocols.episodic.fewshot import EPISODE_SAMPLER_VERSION
from pipeline.protocols.evidence import episodes_fingerprint, evidence_sha256, labels_fingerprint

__all__ = ["EPISODE_SAMPLER_VERSION", "check_paired", "evidence_sha256", "episodes_fingerprint", "labels_fingerprint"]


def check_paired(fingerprint_a: str, fingerprint_b: str, what: str = "test labels") -> None:
    """Raise unless two cells' evidence fingerprints agree, so their outputs can be paired.

    Parameters
    ----------
    fingerprint_a, fingerprint_b : str
        :func:`labels_fingerprint` (classification) or :func:`episodes_fingerprint`
        (few-shot) of the cells of encoders A and B.
    what : str
        What the fingerprints cover, for the message.

    Returns
    -------
    None
    """
    for name, value in (("fingerprint_a", fingerprint_a), ("fingerprint_b", fingerprint_b)):
        if not isinstance(value, str) or not value:
            raise DataValidationError(f"{name} must be a non-empty fingerprint string, got {value!r}")
    if fingerprint_a != fingerprint_b:
        raise DataValidationError(
            f"The two cells were not scored on the same {what} (fingerprint {fingerprint_a[:12]} vs "
            f"{fingerprint_b[:12]}): a paired comparison needs the same examples or episodes, in the "
            "same order. Re-run both encoders on the current data."
        )

"""Sections of the encoder protocols: fine-tuning (validation score of every grid point, the
selected point, test score, calibration before and after temperature scaling, the device it
trained on) and the diagnostics (attentive diffusion, colour errors, with a few saliency
maps and reconstructions as embedded PNGs read from the store)."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from jobs.report.html import Markup, el, link, note, num, pct, row_head, section, table
from jobs.report.model import ReportRun
from jobs.report.sections.scores import BEST_MARKER
from pipeline.errors import RepevalError
from pipeline.protocols.diagnostics.protocols import COLOUR_DETAIL, SALIENCY
from pipeline.protocols.finetune.protocols import FINETUNE
from storage_schema import record_keys

__all__ = ["diagnostics_section", "encoder_sections", "finetune_section"]


def encoder_sections(run: ReportRun, config: Any) -> list[Markup]:
    """The fine-tuning and diagnostics sections (pictures read from ``config``'s store)."""
    return [finetune_section(run), diagnostics_section(run, _examples_reader(config))]


def _of(run: ReportRun, protocol: str) -> list[dict]:
    return [r for r in run.records if r.get("protocol") == protocol]


def _mib(value: Any) -> str:
    return f"{value / 2**20:.0f} MiB" if isinstance(value, (int, float)) and value else "n/a"


def _device(rec: Mapping[str, Any]) -> str:
    gpu = rec.get("gpu") or {}
    name = gpu.get("device_name")
    return f"{gpu.get('device', '?')}" + (f" ({name})" if name else "")


def _point(p: Mapping[str, Any]) -> str:
    return f"lr {p.get('lr'):g}, wd {p.get('weight_decay'):g}, {p.get('augmentation')}"


def _grid_table(rec: Mapping[str, Any]) -> Markup:
    diag = rec.get("diagnostics") or {}
    chosen = diag.get("selected") or {}
    rows = []
    for v in diag.get("val_scores") or []:
        picked = all(v.get(k) == chosen.get(k) for k in ("lr", "weight_decay", "augmentation"))
        score = pct(v.get("score")) + (f" {BEST_MARKER}" if picked else "")
        rows.append([num(v.get("lr"), 4), f"{v.get('weight_decay'):g}", v.get("augmentation"),
                     el("td", el("strong", score) if picked else score, class_="best" if picked else None),
                     num(v.get("train_loss_last")), "yes" if v.get("diverged") else "no"])
    return table(["learning rate", "weight decay", "augmentation", "validation score (%)", "final train loss",
                  "diverged"], rows)


def finetune_section(run: ReportRun) -> Markup:
    """The fine-tuning cells: the grid's validation scores, the selected point, the test score and its calibration."""
    recs = _of(run, FINETUNE)
    body: list[Any] = [note(
        f"Every weight trained with a linear head: each grid point trained on train and scored on validation "
        f"(the dataset's metric), the best point ({BEST_MARKER}) retrained on train + validation and "
        f"tested once. ECE in % with the setting's bins, before and after temperature scaling (temperature "
        f"fitted on the selected point's validation logits). Steps/s: training steps per second over the runs "
        f"this record trained; peak memory: on CUDA only.")]
    if not recs:
        return section("finetune", "Fine-tuning", body + [note("No fine-tuning records.")], empty=True)
    rows = []
    for r in recs:
        m, d, gpu = r.get("metrics") or {}, r.get("diagnostics") or {}, r.get("gpu") or {}
        rows.append([row_head(r.get("model")), r.get("dataset"), r.get("setting"),
                     _point(d.get("selected") or {}), link(r, pct(m.get("score"))), pct(m.get("ece"), 2),
                     pct(m.get("ece_temperature_scaled"), 2), num(d.get("temperature"), 2),
                     f"{len(d.get('val_scores') or [])} x {d.get('steps')} x {d.get('batch_size')}",
                     _device(r), num(gpu.get("steps_per_second"), 2), _mib(gpu.get("peak_memory_bytes"))])
    body.append(table(["encoder", "dataset", "setting", "selected point", "test score (%)", "ECE (%)",
                       "ECE, temp. scaled (%)", "temperature", "grid x steps x batch", "device", "steps/s",
                       "peak memory"], rows))
    for r in recs:
        body.append(el("details", el("summary", f"validation scores per grid point: {r.get('model')} on "
                                                f"{r.get('dataset')} ({r.get('setting')})"), _grid_table(r)))
    return section("finetune", "Fine-tuning", body)


def _examples_reader(config: Any):
    """``read(cell_id) -> PNG bytes or None`` from the config's store (None when unreadable)."""
    try:
        store = config.open_store(read_only=True)
    except (RepevalError, OSError):
        return lambda cid: None

    def read(cid: str) -> bytes | None:
        try:
            return store.backend.read(record_keys.examples_key(cid))
        except (RepevalError, OSError):
            return None

    return read


def _picture(data: bytes | None, alt: str) -> Markup:
    if not data:
        return note(f"{alt}: no pictures stored.")
    return el("img", src=f"data:image/png;base64,{base64.b64encode(data).decode('ascii')}", alt=alt, class_="plot")


def diagnostics_section(run: ReportRun, read_examples) -> Markup:
    """The diagnostics: attentive diffusion of saliency maps and colour errors of reconstructions, with examples."""
    saliency, colour = _of(run, SALIENCY), _of(run, COLOUR_DETAIL)
    body: list[Any] = [note(
        "Attentive diffusion: the percentage of a saliency map's pixels above the map's mean, averaged over "
        "test images (few: focused; many: spread). Colour errors: mean squared error per channel between test "
        "images and images reconstructed from the features (RGB in [0, 1]); perceptual distance only with a "
        "local perceptual network. Correlations read these raw, without the logit transform.")]
    if not saliency and not colour:
        return section("diagnostics", "Encoder diagnostics", body + [note("No diagnostics records.")], empty=True)
    if saliency:
        body.append(el("h3", "Attentive diffusion"))
        body.append(table(["encoder", "dataset", "setting", "method", "images", "attentive diffusion (%)", "device"],
                          [[row_head(r.get("model")), r.get("dataset"), r.get("setting"),
                            (r.get("diagnostics") or {}).get("method"), (r.get("diagnostics") or {}).get("n_images"),
                            link(r, num((r.get("metrics") or {}).get("attentive_diffusion"), 1)), _device(r)]
                           for r in saliency]))
    if colour:
        body.append(el("h3", "Colour and detail kept by the features"))
        rows = []
        for r in colour:
            m = r.get("metrics") or {}
            rows.append([row_head(r.get("model")), r.get("dataset"), r.get("setting"),
                         *(num(m.get(f"colour_mse_{c}"), 4) for c in ("red", "green", "blue")),
                         link(r, num(m.get("colour_mse_mean"), 4)), num(m.get("perceptual_distance"), 4),
                         num((r.get("diagnostics") or {}).get("feature_loss_final"), 3), _device(r)])
        body.append(table(["encoder", "dataset", "setting", "red MSE", "green MSE", "blue MSE", "mean MSE",
                           "perceptual distance", "final feature loss", "device"], rows))
    for r in saliency + colour:
        what = "saliency maps" if r.get("protocol") == SALIENCY else "reconstructions"
        title = f"{what}: {r.get('model')} on {r.get('dataset')} ({r.get('setting')})"
        body.append(el("details", el("summary", title), _picture(read_examples(str(r.get("cell_id"))), title),
                       open=True))
    return section("diagnostics", "Encoder diagnostics", body)

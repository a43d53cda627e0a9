"""The report's ImageNet-CoG section: accuracy per concept-generalisation level, absolute
and relative to the baseline encoder, for datasets named ``cog-l<k>``."""

from __future__ import annotations

import base64
import io

from PIL import Image

from jobs.report import write_report
from tests.helpers.records import make_config, make_record


def test_report_plots_accuracy_per_cog_level_and_relative_to_the_baseline(tmp_path):
    accuracy = {"m0": (0.80, 0.70, 0.55), "m1": (0.85, 0.72, 0.50), "m2": (0.75, 0.70, 0.65)}
    recs = [make_record(m, f"cog-l{k}", "linear", {"score": a, "top1": a})
            for m, levels in accuracy.items() for k, a in enumerate(levels, start=1)]
    recs.append(make_record("m1", "cog-l2", "linear", {"score": 0.60}, layer="block3"))  # a worse layer
    config = make_config(list(accuracy), correlation={"settings": [], "bootstrap": 0}, report={"baseline": "m0"})
    text = open(write_report(recs, None, config, str(tmp_path / "r.html")), encoding="utf-8").read()
    cog = text[text.index('<section id="cog">'):]
    cog = cog[:cog.index("</section>")]
    assert "<th>L1 (%)</th><th>L2 (%)</th><th>L3 (%)</th>" in cog
    assert '<th scope="row">m1</th><td>85.0</td><td>72.0</td><td>50.0</td>' in cog
    (src,) = [s.split('"')[0] for s in cog.split('src="')[1:]]
    Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))).verify()
    plain = make_config(list(accuracy), correlation={"settings": [], "bootstrap": 0})
    other = [make_record(m, "pets", "linear", {"score": 0.5}) for m in accuracy]
    assert 'id="cog"' not in open(write_report(other, None, plain, str(tmp_path / "p.html")), encoding="utf-8").read()

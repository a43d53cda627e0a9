"""The report of a small checkpoint series as a person sees it, in a real headless Chromium
driven by Playwright's Python package (the system's Chromium, found at run time): the first
screen at 1280 x 800 holds the verdict, no console error, every image loads, the folded
blocks open. One screenshot of the first screen stays under the test's temporary folder
(``first-screen.png``) for a person to look at.

The first night of a series with long Lightning-like names (``tests.helpers.small_series.
night_one``) is read the same way: its improvement with the test's interval and p on the
first screen, an untrusted leaderboard row marked in red, tied mean ranks sharing a place,
and every encoder name on one line; its screenshot is ``night-one.png``.

Skipped, with the reason, where Playwright or a Chromium is missing: ``pip install -e
'.[browser]'`` and ``apt-get install chromium`` (docs/development.md)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.helpers.small_series import series_config, write_series

VIEWPORT = {"width": 1280, "height": 800}


def _chromium() -> str | None:
    """The system's Chromium (or Chrome): ``REPEVAL_CHROMIUM``, else the usual names on PATH."""
    named = os.environ.get("REPEVAL_CHROMIUM")
    if named:
        return named
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright's Python package is not installed "
                                   "(pip install -e '.[browser]')")
    executable = _chromium()
    if executable is None:
        pytest.skip("no Chromium on this machine (apt-get install chromium, or set REPEVAL_CHROMIUM)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def series_report(tmp_path_factory) -> Path:
    """Six checkpoints, the newest much worse than the best (step 400); a ridge setting with
    plateau cautions and grid-edge (unreliable) cells."""
    tmp = tmp_path_factory.mktemp("browser")
    return Path(write_series(tmp, series_config(tmp))["report"])


@pytest.fixture()
def opened(browser, series_report, tmp_path):
    page = browser.new_page(viewport=VIEWPORT)
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url[:80]}"))
    page.goto(series_report.as_uri())
    page.wait_for_load_state("load")
    page.screenshot(path=str(tmp_path / "first-screen.png"))  # for a person to look at
    yield page, problems
    page.close()


def _in_first_screen(page, selector: str) -> bool:
    box = page.locator(selector).first.bounding_box()
    return box is not None and box["y"] >= 0 and box["y"] + box["height"] <= VIEWPORT["height"]


#: Where the report puts encoder names: each must stay on its line(s).
NAMES = ".name, th[scope=row], table.series thead th"


def _wrapped_names(page) -> list[str]:
    """The visible name elements laid out on more lines than their <br>s make: a name split."""
    return page.evaluate("""(selector) => Array.from(document.querySelectorAll(selector))
        .filter(e => e.getClientRects().length > 0)
        .filter(e => { const r = document.createRange(); r.selectNodeContents(e);
                       const size = parseFloat(getComputedStyle(e).fontSize);
                       const tops = Array.from(r.getClientRects()).map(b => b.top).sort((a, b) => a - b);
                       let lines = tops.length ? 1 : 0;
                       for (let i = 1; i < tops.length; i++) if (tops[i] - tops[i - 1] > 0.6 * size) lines++;
                       return lines > e.querySelectorAll('br').length + 1; })
        .map(e => e.innerText)""", NAMES)


def test_the_first_screen_holds_the_verdict_and_what_regressed(opened, tmp_path):
    page, problems = opened
    assert (tmp_path / "first-screen.png").stat().st_size > 10_000
    verdict = page.locator("#verdict")
    assert verdict.is_visible() and _in_first_screen(page, "#verdict")
    text = verdict.inner_text()
    assert "Series run7: the newest checkpoint ck-step600 (step 600) is significantly worse than the best so far" \
        in text and "not to be trusted" in text
    assert _in_first_screen(page, "table.changes")  # the regressions, with effect, interval and test
    first_row = page.locator("table.changes tbody tr").first.inner_text()
    assert "ck-step600" in first_row and "ck-step400" in first_row and "mcnemar" in first_row
    order = page.evaluate("""() => ['#verdict', 'table.changes', 'table.leaderboard', 'table.best-so-far',
        '#untrusted', '#cautions'].map(s => document.querySelector(s).getBoundingClientRect().top)""")
    assert order == sorted(order), order
    assert problems == []


def test_no_console_error_and_every_image_loads(opened):
    page, problems = opened
    page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
    images = page.evaluate("""() => Array.from(document.images).map(i => [i.complete, i.naturalWidth])""")
    assert len(images) >= 3 and all(done and width > 0 for done, width in images), images
    assert problems == []


def test_untrusted_red_and_cautions_grey_folded_and_they_expand(opened):
    page, problems = opened
    untrusted = page.locator("#untrusted li")
    assert untrusted.count() >= 1 and "grid_edge" in untrusted.first.inner_text()
    red, grey = page.evaluate("""() => [getComputedStyle(document.querySelector('#untrusted li')).color,
        getComputedStyle(document.querySelector('#cautions')).color]""")
    assert red == "rgb(164, 0, 0)" and grey == "rgb(102, 102, 102)"
    cautions = page.locator("details#cautions")
    assert cautions.get_attribute("open") is None and "plateau" in cautions.locator("summary").first.inner_text()
    assert not page.locator("details.caution-code").first.is_visible()  # folded
    cautions.locator("summary").first.click()
    assert cautions.evaluate("d => d.open") and page.locator("details.caution-code").first.is_visible()
    group = page.locator("details.caution-code").first
    group.locator("summary").click()
    assert group.locator("li").first.is_visible() and "plateau" in group.locator("li").first.inner_text()
    # a provenance link opens its block
    link = group.locator("li a").first
    target = link.get_attribute("href")[1:]
    link.click()
    assert page.locator(f"details[id='{target}']").evaluate("d => d.open")
    assert problems == []


def test_no_empty_section_is_rendered(opened):
    page, _ = opened
    ids = page.evaluate("() => Array.from(document.querySelectorAll('section')).map(s => s.id)")
    assert ids == ["summary", "overview", "series", "accuracy", "ranks", "warnings", "provenance"]
    nav = page.evaluate("() => Array.from(document.querySelectorAll('nav a')).map(a => a.getAttribute('href'))")
    assert nav == [f"#{i}" for i in ids if i != "overview"]


@pytest.fixture(scope="module")
def night_report(tmp_path_factory) -> Path:
    """Night 1: the newest checkpoint significantly better than the one before; the oldest's
    ridge at its grid's edge (untrusted); two encoders tied; names like
    ``vit-b16-lightning-run7-epoch=7-step=200``."""
    from tests.helpers.small_series import night_one

    return Path(night_one(tmp_path_factory.mktemp("night1"))["report"])


def test_night_one_reads_as_a_person_would(browser, night_report, tmp_path):
    from tests.helpers.small_series import NIGHT_ONE, TWINS

    page = browser.new_page(viewport=VIEWPORT)
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.goto(night_report.as_uri())
    page.wait_for_load_state("load")
    page.screenshot(path=str(tmp_path / "night-one.png"))  # for a person to look at
    assert (tmp_path / "night-one.png").stat().st_size > 10_000
    step0, step100, step200 = NIGHT_ONE
    # the improvement, on the first screen, with its evidence: interval, test, adjusted p
    verdict = page.locator("#verdict").inner_text()
    assert f"the newest checkpoint {step200} (step 200) is the best so far on 3 of 3 cell(s) (significantly " \
        "better than the earlier best on 2)" in " ".join(verdict.split())
    assert _in_first_screen(page, "table.changes")
    assert page.locator("table.changes").bounding_box()["x"] + page.locator("table.changes").bounding_box()[
        "width"] <= VIEWPORT["width"]  # the test and its p too, without scrolling sideways
    rows = page.locator("table.changes tbody tr").all_inner_texts()
    assert len(rows) == 2 and all("better" in r and step100 in r for r in rows), rows
    for row in rows:
        interval, test, p_adj = row.split("\t")[-3:]
        assert interval.startswith("[") and test.startswith(("mcnemar", "paired-t")) and float(p_adj) <= 0.05
    # the leaderboard: tied mean ranks share a place; the untrusted rows are marked in red
    board = page.evaluate("""() => Array.from(document.querySelectorAll('table.leaderboard tbody tr')).map(tr =>
        [tr.cells[0].innerText, tr.querySelector('th').innerText.replace('\u26a0', '').trim(),
         !!tr.querySelector('th .mark-unreliable'),
         tr.querySelector('th .mark-unreliable') ?
             getComputedStyle(tr.querySelector('th .mark-unreliable')).color : null])""")
    assert [(place, model) for place, model, _, _ in board] == [
        ("1", step200), ("2", TWINS[0]), ("2", TWINS[1]), ("4", step100), ("5", step0)]
    assert {model for _, model, marked, _ in board if marked} == {step0, step100}
    assert {color for *_, color in board if color} == {"rgb(176, 0, 0)"}
    # every encoder name on one line, in every table it appears in
    assert _wrapped_names(page) == []
    assert page.locator("td.pair", has_text=step200).count() == 5  # the two changes, three cells' best so far
    assert page.locator("table.series thead th", has_text=step0).count() == 3  # a table per setting
    assert problems == []
    page.close()

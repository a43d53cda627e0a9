"""The report of a small checkpoint series as a person sees it, in a real headless Chromium
driven by Playwright's Python package (the system's Chromium, found at run time): the first
screen at 1280 x 800 holds the verdict, no console error, every image loads, the folded
blocks open. One screenshot of the first screen stays under the test's temporary folder
(``first-screen.png``) for a person to look at.

Skipped, with the reason, where Playwright or a Chromium is missing: ``pip install -e
'.[browser]'`` and ``apt-get install chromium`` (README, "The report in a browser")."""

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

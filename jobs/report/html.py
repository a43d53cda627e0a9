"""HTML building blocks of the report: every piece of text is escaped unless it is Markup."""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from storage_schema.provenance import stable_hash

_VOID = frozenset({"img", "meta", "br", "hr"})


class Markup(str):
    """A string that is already HTML (built by ``el``); never escaped again."""


def esc(value: Any) -> Markup:
    """``value`` as HTML text: escaped, unless it is Markup already."""
    return value if isinstance(value, Markup) else Markup(html.escape(str(value), quote=True))


def join(parts: Iterable[Any], sep: str = "") -> Markup:
    """The parts, each escaped, joined as Markup (None parts left out)."""
    return Markup(sep.join(esc(p) for p in parts if p is not None))


def el(tag: str, *children: Any, **attrs: Any) -> Markup:
    """``<tag attrs>children</tag>``; ``class_`` gives ``class``, ``data_x`` gives ``data-x``."""
    flat: list[Any] = []
    for child in children:
        if isinstance(child, (list, tuple)):
            flat.extend(child)
        else:
            flat.append(child)
    attr = "".join(f' {k.rstrip("_").replace("_", "-")}="{esc(v)}"' for k, v in attrs.items()
                   if v is not None and v is not False)
    if tag in _VOID:
        return Markup(f"<{tag}{attr}>")
    return Markup(f"<{tag}{attr}>{join(flat)}</{tag}>")


def table(header: Sequence[Any], rows: Iterable[Sequence[Any]], class_: str | None = None) -> Markup:
    """Rows whose cells are text, Markup or ready ``<td>``/``<th>`` elements."""
    def cell(c: Any) -> Markup:
        return c if isinstance(c, Markup) and c.startswith(("<td", "<th")) else el("td", c)

    head = el("thead", el("tr", [el("th", h) for h in header]))
    body = el("tbody", [el("tr", [cell(c) for c in row]) for row in rows])
    return el("table", head, body, class_=class_)


class Section(Markup):
    """A rendered ``<section>`` that remembers its id and title (for the table of contents)
    and whether it has content (``empty``: only its note that there is nothing to show)."""

    sid: str = ""
    title: str = ""
    empty: bool = False


def section(sid: str, title: str, *body: Any, empty: bool = False, class_: str | None = None) -> Section:
    """A ``<section>`` with its heading, remembering its id and title for the table of contents."""
    out = Section(el("section", el("h2", title), *body, id=sid, class_=class_))
    out.sid, out.title, out.empty = sid, title, empty
    return out


def note(text: Any) -> Markup:
    """A paragraph that explains what a section shows."""
    return el("p", text, class_="note")


def notice(text: Any) -> Markup:
    """A paragraph that warns (failures, a missing reference)."""
    return el("p", text, class_="notice")


def row_head(text: Any) -> Markup:
    """A row's header cell (kept on one line: a name never wraps at its hyphens)."""
    return el("th", text, scope="row")


def name(text: Any) -> Markup:
    """An encoder's (or a cell's) name inside other text: kept on one line, never wrapped at
    a hyphen or a slash (``epoch=7-step=80`` is not ``epoch=7-`` over ``step=80``)."""
    return el("span", text, class_="name")


# -- numbers, labels, anchors ----------------------------------------------------------------
def is_number(value: Any) -> bool:
    """Whether ``value`` is a finite number (not a bool): what a table prints as one."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def pct(value: Any, digits: int = 1) -> str:
    """``value`` in percent, or n/a when it is not a finite number."""
    return f"{100.0 * value:.{digits}f}" if is_number(value) else "n/a"


def num(value: Any, digits: int = 3) -> str:
    """``value`` with ``digits`` decimals, or n/a when it is not a finite number."""
    return f"{value:.{digits}f}" if is_number(value) else "n/a"


def label_of(rec: Mapping[str, Any]) -> str:
    """``model/dataset/layer:setting`` of a record."""
    return f"{rec.get('model')}/{rec.get('dataset')}/{rec.get('layer')}:{rec.get('setting')}"


def anchor(rec: Mapping[str, Any]) -> str:
    """``cell-<cell id>``; a record shown under another name than it was recorded under (two
    encoders with identical weights share it) gets its own block, so ``-<hash of the name>``."""
    cid = str(rec.get("cell_id") or stable_hash(label_of(rec), length=16))
    suffix = f"-{stable_hash(label_of(rec), length=8)}" if rec.get("recorded_as") else ""
    return "cell-" + re.sub(r"[^A-Za-z0-9_-]", "_", cid) + suffix


def link(rec: Mapping[str, Any], text: Any) -> Markup:
    """A link from a table's score to its record's provenance block."""
    return el("a", text, href=f"#{anchor(rec)}", title=f"provenance of {label_of(rec)}")


# -- the page --------------------------------------------------------------------------------
_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em}th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}
th[scope=row],table.warnings td,table.facts td{text-align:left}thead th{background:#f2f2f2}
td.best{background:#e6f4e6}.best-marker{color:#b8860b}td.violation{background:#fbe3e3}
.note{color:#555}.notice{color:#a40000;font-weight:bold}img.plot{max-width:100%;display:block}
a{color:inherit}details{margin:0.3em 0}details:target,details[open]{background:#fafafa}
pre{font-size:12px;overflow-x:auto}section.failing{border:2px solid #a40000;padding:0 1em}
.mark-regression,.mark-failure,.mark-unreliable{color:#b00000}.mark-improvement{color:#1a7f37}.mark-caution{color:#777}
#verdict{margin:0.5em 0 1em}p.verdict{font-size:1.1em;margin:0.2em 0}p.verdict.bad{color:#a40000;font-weight:bold}
div.untrusted{color:#a40000}details.cautions,details.cautions .note{color:#666}td.agreement{text-align:left}
table.changes td,table.changes th{text-align:left}td.regression,td.improvement{white-space:nowrap}
summary{cursor:pointer}td.untrusted{background:#fff4e5}div.wide{overflow-x:auto}
th[scope=row],.name,table.series thead th{white-space:nowrap}
"""
# Following a provenance link opens the <details> block it points at.
_JS = ("function openTarget(){var e=document.getElementById(decodeURIComponent(location.hash.slice(1)));"
       "if(e&&e.tagName==='DETAILS'){e.open=true;}}"
       "window.addEventListener('hashchange',openTarget);window.addEventListener('load',openTarget);")


def page(title: str, sections: Sequence[Markup]) -> str:
    """The whole HTML document: one page, styles and script inline (no file beside it)."""
    head = el("head", Markup('<meta charset="utf-8">'), el("title", title), Markup(f"<style>{_CSS}</style>"),
              Markup(f"<script>{_JS}</script>"))
    return "<!DOCTYPE html>\n" + el("html", head, el("body", el("h1", title), list(sections)), lang="en") + "\n"

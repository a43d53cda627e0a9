"""A strict reading of generated HTML: every element closed, in order, and its tags counted."""

from __future__ import annotations

from collections import Counter
from html.parser import HTMLParser

VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"})


class _Strict(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[str] = []
        self.tags: Counter[str] = Counter()
        self.problems: list[str] = []
        self.img_sources: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags[tag] += 1
        if tag == "img":
            self.img_sources.append(dict(attrs).get("src") or "")
        if tag not in VOID:
            self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            self.problems.append(f"</{tag}> closes a void element (line {self.getpos()[0]})")
        elif not self.open or self.open[-1] != tag:
            self.problems.append(f"</{tag}> closes <{self.open[-1] if self.open else 'nothing'}> "
                                 f"(line {self.getpos()[0]})")
        else:
            self.open.pop()


def parse_strict(text: str) -> _Strict:
    """Parse ``text``; raise AssertionError naming the first badly nested or unclosed element.

    Returns the parser: ``tags`` counts every start tag, ``img_sources`` lists image sources.
    """
    parser = _Strict()
    parser.feed(text)
    parser.close()
    if parser.open:
        parser.problems.append(f"unclosed elements at the end: {parser.open}")
    assert not parser.problems, "malformed HTML: " + "; ".join(parser.problems[:5])
    return parser

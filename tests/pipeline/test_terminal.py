"""What reaches a terminal: control characters escaped, quoted values bounded."""

from __future__ import annotations

import io

from pipeline.terminal import TerminalStream, printable, printable_text, short

HOSTILE = ["evil\x1b]0;pwned\x07", "red\x1b[31mX\x1b[0m", "two\nlines", "cr\roverwrite", "bidi\u202etxt.exe",
           "c1\x9bcsi", "nul\x00", "del\x7f", "sep\u2028line"]


def test_every_control_and_reordering_character_is_escaped_as_python_writes_it():
    for name in HOSTILE:
        out = printable(name)
        assert out.isprintable(), (name, out)
        assert out == repr(name)[1:-1] or "\\u" in out  # Python's own escapes (repr leaves \u202e raw)
    assert printable("plain-name_1.0 é ü 猫") == "plain-name_1.0 é ü 猫"  # letters of any script stay
    assert printable(3.5) == "3.5" and printable("\u202e") == "\\u202e"


def test_text_keeps_its_own_layout_but_not_escape_sequences():
    assert printable_text("a\tb\nc\r") == "a\tb\nc\r"
    assert printable_text("x\x1b[2Jy\u202e") == "x\\x1b[2Jy\\u202e"


def test_short_quotes_an_alias_bomb_at_once_and_briefly():
    row = ["x"] * 1_000_000
    bomb = [row] * 1_000_000  # 10^12 items as YAML aliases expand them: never walked whole
    out = short(bomb)
    assert len(out) <= 80 and out.startswith("[['x', 'x'")
    assert short("a" * 10_000).endswith("...") and len(short("a" * 10_000)) == 80
    assert short("evil\x1b]0;x\x07") == "'evil\\x1b]0;x\\x07'"
    assert short({"k": 1}) == "{'k': 1}"


def test_a_terminal_stream_escapes_what_is_written_through_it():
    raw = io.StringIO()
    stream = TerminalStream(raw)
    print("class", HOSTILE[0], file=stream)
    assert stream.write("\x1b[31m") == 5 and raw.getvalue() == "class evil\\x1b]0;pwned\\x07\n\\x1b[31m"
    assert stream.getvalue() == raw.getvalue()  # everything else is the wrapped stream's

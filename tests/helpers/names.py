"""Hypothesis strategies of names that must never become store key components."""

from __future__ import annotations

from hypothesis import strategies as st

from pipeline.names import MAX_NAME_LENGTH

SAFE = st.text("abcXYZ019_.+=@-", min_size=1, max_size=12).filter(lambda s: s[0] not in ".+=@-")
SEPARATORS = st.sampled_from(["/", "\\"])

bad_names = st.one_of(
    st.just(""),
    st.sampled_from([".", "..", "../..", "/", "/etc/passwd", "~", "~/x", "C:\\x", "..\\x", "./x"]),
    st.builds(lambda a, s, b: a + s + b, SAFE | st.just(".."), SEPARATORS, SAFE | st.just("..")),
    st.builds(lambda s: "../" + s, SAFE),
    st.builds(lambda s: "/" + s, SAFE),
    st.builds(lambda lead, s: lead + s, st.sampled_from(list(".+=@-")), SAFE),
    st.builds(lambda a, c, b: a + c + b, SAFE, st.characters(max_codepoint=31) | st.just("\x7f"), SAFE),
    # non-ASCII: look-alike slashes, dots and spaces, bidi overrides, accents, emoji
    st.builds(lambda a, c, b: a + c + b, SAFE,
              st.sampled_from(["\u2215", "\uff0f", "\u2024", "\u202e", "\u200b", "\u00e9", "\U0001f600",
                               "\u0130", "\u00a0", " "])
              | st.characters(min_codepoint=128, exclude_categories=("Cs",)), SAFE),
    st.text("ab_", min_size=MAX_NAME_LENGTH + 1, max_size=MAX_NAME_LENGTH + 50).filter(lambda s: s[0] != "."),
)

"""The printable-id rule itself: which characters it refuses, and that its reason is inert."""

from __future__ import annotations

import pytest

from clarion.printable_ids import check_printable_id, unprintable

REFUSED = {
    "a\x00b": "a control character",
    "a\x1b[2J": "a control character",
    "a\x7f": "a control character",
    "a\x85b": "a control character",  # C1 NEL
    "a\u202eb": "a format character",
    "a\u2066b": "a format character",  # a bidi isolate
    "a\u200db": "a format character",  # zero-width joiner
    "\ufeffa": "a format character",  # BOM
    "a\ud800": "a lone surrogate",
    "a\U000f0000": "a private-use character",
    "a\u0378": "an unassigned code point",
    "a\u2028b": "a line separator",
    "a\u2029b": "a paragraph separator",
}


@pytest.mark.parametrize(("text", "kind"), REFUSED.items(), ids=ascii)
def test_each_refused_category_is_named_and_quoted_inert(text: str, kind: str) -> None:
    problem = unprintable(text)
    assert problem is not None and kind in problem
    assert problem.isprintable(), "the reason quotes the character as its escape"
    with pytest.raises(ValueError, match="printable"):
        check_printable_id(text)


@pytest.mark.parametrize("text", [" a", "a ", "\u3000a", "a\u00a0"], ids=ascii)
def test_whitespace_at_either_end_is_refused(text: str) -> None:
    assert unprintable(text) == (
        "starts or ends with whitespace; an id may hold only printable characters, and no whitespace "
        "at either end"
    )


@pytest.mark.parametrize(
    "text",
    ["ada@example.com", "Ada Lovelace", "a\u00a0b", "a\u3000b", "山田", "محمد", "ß", "😀", "a'\"<>&;|`$"],
    ids=ascii,
)
def test_printable_text_with_spaces_inside_is_an_id(text: str) -> None:
    assert unprintable(text) is None
    assert check_printable_id(text) == text

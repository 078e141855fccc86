"""Clarion's own email tracking, the parts without a server: link rewriting and the signed tokens."""

from __future__ import annotations

import html
import uuid

import pytest

from clarion.tracking_tokens import InvalidToken, make_tracking_token, verify_tracking_token
from core.email_tracking import MAX_LINK_CHARS, MAX_TRACKED_HREFS, track_html
from core.engagement import MAX_LINKS

NID = uuid.UUID("0193a8c2-0000-7000-8000-000000000001")


def tracked(body: str, keep: tuple[str, ...] = ()) -> str:
    return track_html(
        body,
        click_url=lambda link: "https://c.example/t/c/" + link.replace("https://", "").replace("/", "_"),
        open_url="https://c.example/t/o/PIXEL",
        keep=lambda link: link.startswith(keep) if keep else False,
    )


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('<a href="https://shop.example/o/1">x</a>', '<a href="https://c.example/t/c/shop.example_o_1">x</a>'),
        ("<A HREF='https://shop.example/a'>x</A>", "<A HREF='https://c.example/t/c/shop.example_a'>x</A>"),
        ('<a class="b" href = "https://s.example/?a=1&amp;b=2">', '<a class="b" href = "https://c.example/t/c/s.example_?a=1&amp;b=2">'),
        ('<a href="mailto:ada@example.com">', '<a href="mailto:ada@example.com">'),
        ('<a href="tel:+14155550100">', '<a href="tel:+14155550100">'),
        ('<a href="#top">', '<a href="#top">'),
        ('<a href="/relative">', '<a href="/relative">'),
        ('<a href="javascript:alert(1)">', '<a href="javascript:alert(1)">'),
        ('<link href="https://s.example/style.css">', '<link href="https://s.example/style.css">'),
        ('<img src="https://s.example/logo.png">', '<img src="https://s.example/logo.png">'),
    ],
)  # fmt: skip
def test_web_links_of_anchors_are_rewritten_and_nothing_else(body: str, expected: str) -> None:
    assert tracked(body).startswith(expected)


def test_entities_in_a_link_are_decoded_for_the_token_and_the_new_link_escaped() -> None:
    seen: list[str] = []

    def click(link: str) -> str:
        seen.append(link)
        return 'https://c.example/t/c/"&<'

    out = track_html('<a href="https://s.example/?a=1&amp;b=2">x</a>', click_url=click, open_url="o")
    assert seen == ["https://s.example/?a=1&b=2"]
    assert f'href="{html.escape(chr(34).join(["https://c.example/t/c/", "&<"]), quote=True)}"' in out


def test_long_links_and_kept_links_stay_as_they_are() -> None:
    long = "https://s.example/" + "a" * MAX_LINK_CHARS
    iri = "https://s.example/" + "é" * 400  # as JSON each é is \\u00e9: its token would not fit
    body = (
        f'<a href="{long}">x</a><a href="https://api.example/v1/unsubscribe?t=1">u</a>'
        f'<a href="{iri}">i</a><a href="https://s.example/a\\b">b</a>'
    )
    out = tracked(body, keep=("https://api.example/v1/unsubscribe",))
    assert out.startswith(body)


def test_the_longest_trackable_link_makes_a_token_the_route_takes() -> None:
    from clarion.tracking_tokens import MAX_TOKEN_CHARS

    link = "https://s.example/?" + "&" * (MAX_LINK_CHARS - 19)
    token = make_tracking_token(secret="s", tenant_id="t" * 64, notification_id=NID, link=link)
    assert len(link) == MAX_LINK_CHARS and len(token) <= MAX_TOKEN_CHARS


def test_the_open_pixel_goes_before_the_last_body_end_or_at_the_end() -> None:
    assert tracked("<html><body>Hi</body></html>") == (
        '<html><body>Hi<img src="https://c.example/t/o/PIXEL" width="1" height="1" alt="" '
        'style="display:block;border:0;width:1px;height:1px"></body></html>'
    )
    assert tracked("plain").startswith("plain<img ")


@pytest.mark.parametrize(
    "body",
    [
        "<a " * 33_000 + '<a href="https://s.example/">',
        '<a href="' * 11_000 + '<a href="https://s.example/">',
        "<a " + " " * 100_000 + 'href="https://s.example/">',
    ],
)
def test_a_hostile_body_is_not_quadratic(body: str) -> None:
    out = tracked(body)  # with unbounded repeats each of these took minutes
    assert out.count("c.example/t/c/") <= 1


def test_a_link_repeated_is_given_one_click_url() -> None:
    made: list[str] = []

    def click_url(link: str) -> str:
        made.append(link)
        return f"https://c.example/t/c/{len(made)}"

    body = '<a href="https://a.example/">x</a><a href="https://b.example/">y</a>' * 200
    out = track_html(body, click_url=click_url, open_url="https://c.example/t/o/P")
    assert made == ["https://a.example/", "https://b.example/"]
    assert out.count('"https://c.example/t/c/1"') == out.count('"https://c.example/t/c/2"') == 200


def test_at_most_max_links_distinct_links_are_tracked_the_rest_left_as_written() -> None:
    body = "".join(f'<a href="https://s.example/{i}">{i}</a>' for i in range(MAX_LINKS + 20))
    out = tracked(body)
    assert out.count("c.example/t/c/") == MAX_LINKS
    assert '<a href="https://s.example/100">' in out and '<a href="https://s.example/119">' in out
    assert '<a href="https://c.example/t/c/s.example_99">' in out


def test_at_most_max_tracked_hrefs_links_are_rewritten_however_few_distinct() -> None:
    out = tracked('<a href="https://s.example/">x</a>' * (MAX_TRACKED_HREFS + 50))
    assert out.count("c.example/t/c/") == MAX_TRACKED_HREFS
    assert out.count('<a href="https://s.example/">') == 50


def test_tokens_carry_their_link_and_refuse_any_change() -> None:
    token = make_tracking_token(
        secret="s1", tenant_id="acme", notification_id=NID, link="https://s.example/x"
    )
    claims = verify_tracking_token(token, secrets=["s1"])
    assert (claims.tenant_id, claims.notification_id, claims.link) == ("acme", NID, "https://s.example/x")
    pixel = verify_tracking_token(
        make_tracking_token(secret="s1", tenant_id="acme", notification_id=NID, link=None), secrets=["s1"]
    )
    assert pixel.link is None
    assert verify_tracking_token(token, secrets=["new", "s1"]).link == "https://s.example/x"  # rotated
    payload, signature = token.split(".")
    other = make_tracking_token(
        secret="s1", tenant_id="acme", notification_id=NID, link="https://evil.example"
    )
    for forged in (
        f"{other.split('.')[0]}.{signature}",  # another link under this signature
        f"{payload}.{signature[:-2]}AA",
        token + "x",
        "x" * 20_000,
        "",
        "é.é",
    ):
        with pytest.raises(InvalidToken):
            verify_tracking_token(forged, secrets=["s1"])
    with pytest.raises(InvalidToken):
        verify_tracking_token(token, secrets=["s2"])


def test_a_push_token_is_not_a_tracking_token() -> None:
    from clarion.engagement_tokens import make_engagement_token

    push = make_engagement_token(secret="s1", tenant_id="acme", notification_id=NID, ttl_s=60)
    with pytest.raises(InvalidToken):
        verify_tracking_token(push, secrets=["s1"])

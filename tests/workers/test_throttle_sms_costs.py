"""What an SMS costs at the provider: its segments, counted by the GSM-7 and UCS-2 rules, even for
text no codec can encode."""

from __future__ import annotations

import pytest

from core.render import RenderedContent
from tests.fixtures.throttle_gate import HELLO, PHONE, gate_for, notification, rule_row
from workers.throttle import sms_segments


@pytest.mark.parametrize(
    ("body", "segments"),
    [
        ("a" * 160, 1),
        ("a" * 161, 2),
        ("a" * 306, 2),
        ("a" * 307, 3),
        ("€" * 80, 1),  # GSM-7 extension characters count twice
        ("€" * 81, 2),
        ("é" * 160, 1),  # in the GSM-7 basic set
        ("ł" * 70, 1),  # not GSM-7: UCS-2
        ("ł" * 71, 2),
        ("😀" * 35, 1),  # two UTF-16 units each
        ("😀" * 36, 2),
    ],
)
def test_sms_segments_follow_the_gsm7_and_ucs2_rules(body: str, segments: int) -> None:
    assert sms_segments(body) == segments


@pytest.mark.parametrize(
    ("body", "segments"),
    [
        ("Code: \ud800", 1),  # the poisoned SMS: a lone surrogate is one UTF-16 unit
        ("\udfff" * 70, 1),
        ("\udc80" * 71, 2),
        ("a\ud83d" + "😀" * 34, 1),  # 1 + 1 + 68 units
        ("a\ud83d" + "😀" * 35, 2),
    ],
)
def test_sms_segments_counts_text_no_codec_can_encode_instead_of_raising(body: str, segments: int) -> None:
    assert sms_segments(body) == segments


async def test_a_multi_segment_sms_costs_its_segments_at_the_provider() -> None:
    gate = gate_for(rule_row(scope="provider", limit=3, period_s=1.0, action="delay"))
    three_segments = RenderedContent(subject=None, body="x" * 400, html=None)
    assert await gate.admit(notification(channel="sms"), three_segments, PHONE) is None
    held = await gate.admit(notification(channel="sms"), HELLO, PHONE)
    assert held.status == "delayed"

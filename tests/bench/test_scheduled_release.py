"""``bench.scheduled_release``'s arithmetic: the release's rate, which of B's sends each stretch
holds, and the verdict on B's p99."""

from __future__ import annotations

import datetime as dt
import math

import pytest

from bench.scheduled_release import Release, Send, quantiles, slowest_by_window, stretches, verdict

T = dt.datetime(2026, 11, 28, 12, tzinfo=dt.UTC)


def at(s: float) -> dt.datetime:
    return T + dt.timedelta(seconds=s)


def test_a_release_runs_from_its_first_send_to_its_last() -> None:
    release = Release.of([at(3.0), at(1.0), at(11.0), at(2.0)])
    assert (release.count, release.first, release.last) == (4, at(1.0), at(11.0))
    assert release.span_s == 10.0
    assert release.per_s == pytest.approx(0.3)  # three gaps in ten seconds
    assert math.isinf(Release.of([at(5.0), at(5.0)]).per_s)  # all at one instant


def test_the_stretches_split_b_by_when_it_was_accepted() -> None:
    sends = [
        Send(at(-9.0), at(-8.9)),  # quiet
        Send(at(-0.1), at(30.0)),  # accepted before T: quiet, however late it was sent
        Send(at(0.0), at(0.2)),  # at T: during
        Send(at(20.0), None),  # during, not sent
        Send(at(20.5), at(21.0)),  # after A's last send: neither
    ]
    quiet, during = stretches(sends, due_at=T, release_end=at(20.0))
    assert quiet == sends[:2]
    assert during == sends[2:4]
    assert [s.latency_s for s in sends] == pytest.approx([0.1, 30.1, 0.2, None, 0.5])


def test_quantiles_are_p50_p90_p99_and_the_max() -> None:
    p50, p90, p99, top = quantiles([i / 100 for i in range(101)])  # 0.00 .. 1.00
    assert (p50, p90, p99, top) == pytest.approx((0.5, 0.9, 0.99, 1.0))


def test_the_verdict_holds_b_p99_during_the_release_to_the_target() -> None:
    fast = [Send(at(i / 10), at(i / 10 + 0.05)) for i in range(100)]
    assert verdict(fast, 1.0).startswith("met")
    slow = fast[:97] + [Send(at(10.0), at(12.0)) for _ in range(3)]  # 3% take 2 s: p99 is 2 s
    assert verdict(slow, 1.0).startswith("NOT met")
    assert verdict([*fast[:98], Send(at(10.0), None), *fast[98:]], 1.0).startswith("NOT met")
    assert verdict(fast[:1], 1.0).startswith("NOT measured")


def test_the_slowest_send_of_each_window_from_t() -> None:
    sends = [
        Send(at(-1.0), at(5.0)),  # before T: in no window
        Send(at(0.5), at(0.6)),
        Send(at(9.0), at(12.0)),  # window 0's slowest: 3 s
        Send(at(25.0), at(25.5)),  # window 2; window 1 had none
        Send(at(31.0), None),  # window 3: not sent, whatever else it holds
        Send(at(32.0), at(32.1)),
    ]
    assert slowest_by_window(sends, start=T, width_s=10.0) == pytest.approx([3.0, 0.0, 0.5, None])
    assert slowest_by_window([], start=T, width_s=10.0) == []

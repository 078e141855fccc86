"""``bench.drop_blip``'s arithmetic: which probe sends a stretch counts, and the sign test's chance."""

from __future__ import annotations

import pytest

from bench.drop_blip import Stretch, at_least
from bench.growth_drop import Sample


def test_a_stretch_holds_the_sends_in_flight_during_it() -> None:
    samples = [
        Sample(at_s=0.0, latency_s=0.9, accepted=True),  # ends before the stretch
        Sample(at_s=0.5, latency_s=0.6, accepted=True),  # started before, still in flight at 1.0
        Sample(at_s=1.2, latency_s=0.1, accepted=True),  # inside
        Sample(at_s=1.9, latency_s=0.5, accepted=False),  # started inside, ended after
        Sample(at_s=2.1, latency_s=0.1, accepted=True),  # after
    ]
    stretch = Stretch.of(samples, 1.0, 2.0)
    assert stretch.latencies_s == [0.6, 0.1, 0.5]
    assert stretch.slowest_s == 0.6
    assert Stretch.of(samples, 5.0, 6.0).slowest_s == 0.0


@pytest.mark.parametrize(
    ("k", "n", "chance"),
    [(0, 10, 1.0), (5, 10, 638 / 1024), (9, 10, 11 / 1024), (10, 10, 1 / 1024), (1, 1, 0.5)],
)
def test_the_chance_of_k_or_more_heads_in_n_fair_tosses(k: int, n: int, chance: float) -> None:
    assert at_least(k, n) == pytest.approx(chance)

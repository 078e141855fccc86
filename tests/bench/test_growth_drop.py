"""``bench.growth``'s blip verdict: the stretch around the drop is held against every other stretch
of the run as long, tiled before and after it, so only a stretch that stands out fails it."""

from __future__ import annotations

from bench.growth_drop import Sample, slowest_per_window


def _samples(latencies_by_second: dict[float, float]) -> list[Sample]:
    return [Sample(at_s=at, latency_s=ms / 1000, accepted=True) for at, ms in latencies_by_second.items()]


def test_windows_tile_the_run_before_and_after_the_drop_and_skip_it() -> None:
    samples = _samples(
        {0.5: 10, 1.5: 40, 2.5: 20, 3.5: 30, 4.2: 900, 5.0: 800, 6.5: 50, 7.5: 60, 8.5: 70, 9.9: 5}
    )

    # drop stretch [4, 6): windows [0, 2), [2, 4) before; [6, 8), [8, 10) after
    assert slowest_per_window(samples, length_s=2.0, skip=(4.0, 6.0), end_s=10.0) == [0.04, 0.03, 0.06, 0.07]


def test_a_remainder_shorter_than_the_stretch_and_an_empty_window_are_left_out() -> None:
    samples = _samples({0.5: 10, 2.5: 20, 7.0: 30, 9.5: 40})

    # before [3, 5): [0, 2) only ([2, 3) is too short); after: [5, 7) is empty, [7, 9) holds 30,
    # [9, 10) is too short
    assert slowest_per_window(samples, length_s=2.0, skip=(3.0, 5.0), end_s=10.0) == [0.01, 0.03]


def test_no_samples_give_no_windows() -> None:
    assert slowest_per_window([], length_s=2.0, skip=(4.0, 6.0), end_s=10.0) == []


def test_a_run_that_divides_into_whole_stretches_keeps_its_last_one() -> None:
    samples = _samples({0.1: 10, 11.5: 20, 19.9: 30})

    # 11.2 + 4 x 2.2 = 20.0, though (20 - 11.2) / 2.2 is 3.999... in floating point
    assert slowest_per_window(samples, length_s=2.2, skip=(9.0, 11.2), end_s=20.0)[-1] == 0.03

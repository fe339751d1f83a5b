"""The failover benchmark's table and its comparison's statistics, from synthetic runs (the live
runs need root and minutes)."""

from __future__ import annotations

import math
import random

import pytest

from bench import failover_bench as fb
from mrcstack.experiments.live import FaultCase, Run

FAULT_AT = 100.0
STEP = 0.001  # one completion of 1 unit per millisecond: the pre-fault rate


def series(gap_ms: int, *, before: bool = True) -> tuple[tuple[float, int], ...]:
    """A steady series that stops for ``gap_ms`` right after the fault."""
    t0 = FAULT_AT - 1.5 if before else FAULT_AT
    count = int((FAULT_AT + 1.5 - t0) / STEP)
    times = (t0 + i * STEP for i in range(count))
    return tuple((t, 1) for t in times if not FAULT_AT <= t < FAULT_AT + gap_ms / 1e3)


def runs(stack: str, gap_ms: int, n: int = 3, *, before: bool = True) -> list[Run]:
    return [Run(stack, series(gap_ms, before=before), FAULT_AT, {"rack": 2.0}, 1.0, 3.0)
            for _ in range(n)]  # fmt: skip


def case(name: str, target: float = 5.0) -> FaultCase:
    return FaultCase(name, name, lambda f: None, target)


def test_rows_print_medians_and_the_check_fails_only_over_twice_the_target(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = [
        (case("fine", 50.0), {"mrcd": runs("mrcd", 20), "mptcp": runs("mptcp", 300)}),
        (case("slow"), {"mrcd": runs("mrcd", 40), "mptcp": runs("mptcp", 300)}),
        (case(fb.CONTROL, 0.0), {"mrcd": runs("mrcd", 40), "mptcp": runs("mptcp", 0)}),
    ]
    assert fb.report(rows[:1] + rows[2:], "t", check=True)  # the control has no target
    assert not fb.report(rows, "t", check=True)
    out = capsys.readouterr().out
    names = ("fine", "slow", fb.CONTROL)
    fine, slow, control = [line for line in out.splitlines() if line.split()[0] in names][-3:]
    assert (
        float(fine.split()[1]) == pytest.approx(20, abs=1.5)
        and "OVER" not in fine
        and "rack 6" in fine
    )
    assert float(slow.split()[1]) == pytest.approx(40, abs=1.5) and slow.endswith("OVER 2x TARGET")
    assert "OVER" not in control and "no fault on the path" in control


def test_a_run_that_moved_nothing_before_the_fault_is_counted_not_fatal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    mptcp = runs("mptcp", 300, 2) + runs("mptcp", 0, 1, before=False)
    assert fb.report([(case("x"), {"mrcd": runs("mrcd", 3), "mptcp": mptcp})], "t", True)
    row = capsys.readouterr().out.splitlines()[-1]
    assert "MPTCP 1 run(s) moved nothing before the fault" in row
    # every mrcd run without a pre-fault rate: nothing to report, and the check fails
    dead = {"mrcd": runs("mrcd", 0, 2, before=False), "mptcp": runs("mptcp", 300)}
    assert not fb.report([(case("y"), dead)], "t", check=True)


def test_the_median_lower_bound_is_the_binomial_order_statistic() -> None:
    values = [float(v) for v in range(9, 0, -1)]  # 9 .. 1, unsorted
    assert fb.median_lower_bound(values) == 3.0  # P(Bin(9, 1/2) <= 2) = 46/512 <= 0.1
    assert fb.median_lower_bound([float(v) for v in range(15)]) == 4.0  # the 5th smallest
    assert fb.median_lower_bound([7.0, 5.0, 6.0]) == 5.0  # too few for 90%: the smallest
    assert fb.median_lower_bound([1.0, 2.0, 3.0], confidence=0.8) == 1.0
    assert fb.median_lower_bound([]) != fb.median_lower_bound([])  # nan


def test_a_median_over_twice_the_target_by_chance_is_named_but_does_not_fail(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Nine runs, five of them over 2x the target (median 12 ms, target 5): a busy machine
    scatters runs that much, and five of nine over the limit do not put the median there
    with 90% confidence.  Seven of nine do."""
    gaps = [0, 0, 0, 2, 12, 12, 14, 30, 40]
    noisy = [Run("mrcd", series(g), FAULT_AT, {}, 1.0, 3.0) for g in gaps]
    row = (case("noisy"), {"mrcd": noisy, "mptcp": runs("mptcp", 300)})
    assert fb.report([row], "t", check=True)
    line = capsys.readouterr().out.splitlines()[-1]
    assert "OVER" not in line and "by chance at 90% (9 runs)" in line
    worse = [Run("mrcd", series(g), FAULT_AT, {}, 1.0, 3.0) for g in [0, 2] + [15] * 7]
    assert not fb.report([(case("worse"), {"mrcd": worse, "mptcp": runs("mptcp", 300)})],
                         "t", check=True)  # fmt: skip


def test_a_loss_within_the_noise_of_zero_is_a_ratio_of_zero_to_mptcp(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A median below zero (the runs moved more after the fault than before) is no loss:
    its ratio to MPTCP's loss is 0, not negative."""
    extra = tuple((FAULT_AT + 0.0005 + i * STEP, 1) for i in range(20))  # 20 ms ahead
    ahead = [Run("mrcd", tuple(sorted(series(0) + extra)), FAULT_AT, {}, 1.0, 3.0)] * 3
    assert fb.report([(case("ahead"), {"mrcd": ahead, "mptcp": runs("mptcp", 300)})], "t", True)
    fields = capsys.readouterr().out.splitlines()[-1].split()
    assert float(fields[1]) == pytest.approx(-20, abs=1.5) and fields[12] == "0.000"


def test_the_permutation_test_tells_a_shift_from_the_noise() -> None:
    """Two samples of one spread: a large p; the same shifted by far more than the spread: a
    p near 0; a shift within it is not told apart.  Seeded: the same p every run."""
    rng = random.Random(7)
    noise = [rng.gauss(0.0, 10.0) for _ in range(60)]
    a, b = noise[:30], noise[30:]
    assert fb.median_shift_p(a, b) > 0.2
    assert fb.median_shift_p(a, [x + 40.0 for x in b]) < 0.01
    assert fb.median_shift_p(a, [x + 2.0 for x in b]) > 0.05
    assert fb.median_shift_p(a, b) == fb.median_shift_p(a, b)
    assert math.isnan(fb.median_shift_p([], b))


def test_bad_counts_are_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["--runs", "0"], ["--against", "HEAD", "--batches", "0"]):
        with pytest.raises(SystemExit) as exc:
            fb.main(args)
        assert exc.value.code == 2
        assert "--batches want a number >= 1" in capsys.readouterr().err

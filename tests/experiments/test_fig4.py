"""Fig 4's claims are computed from its runs: runs without the mapper's denylist fail
every one of them (the quick profile's own runs pass them: test_experiments.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mrcstack.experiments import simruns
from mrcstack.experiments.figures import fig4_job_start, fig4_testbed
from mrcstack.sim import SimConfig
from mrcstack.sim.config import MapperSpec


def test_the_simulators_claims_pass_with_the_mapper_and_fail_without(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, _, claims, figures = fig4_job_start.simulated_part(simruns.Sim("quick", 1))
    assert claims and all(c.passed for c in claims)
    assert figures.data_on_bad["no_mapper"] > 0 and figures.qps_on_bad["no_mapper"] > 0
    real = simruns.sim_run

    def watching(cfg: SimConfig) -> object:
        """The mapper only watches: its denylist reaches no QP."""
        assert isinstance(cfg.mapper, MapperSpec)
        return real(replace(cfg, mapper=replace(cfg.mapper, deny=False)))

    monkeypatch.setattr(simruns, "sim_run", watching)
    _, _, claims, _ = fig4_job_start.simulated_part(simruns.Sim("quick", 1))
    assert claims and not any(c.passed for c in claims)


def _run(variant: str, crossed: int, retx_per_bin: float) -> fig4_testbed.TestbedRun:
    hosts = fig4_testbed.FABRIC.hosts
    return fig4_testbed.TestbedRun(
        variant, [[retx_per_bin] * hosts for _ in range(12)], [1.0] * 12, crossed, 1.2
    )


def test_the_testbeds_claims_pass_with_the_mapper_and_fail_without() -> None:
    """Measured here: with the mapper no data packet crossed the bad links and the job
    retransmitted about a quarter as much (9 against 40 in 3 s); without it, 1050 did."""
    with_ = [_run("mapper", 0, 0.2), _run("mapper", 0, 0.1), _run("mapper", 3, 0.5)]
    without = [
        _run("no_mapper", 1050, 0.8),
        _run("no_mapper", 990, 0.9),
        _run("no_mapper", 1020, 0.7),
    ]
    passed = fig4_testbed.claims({"mapper": with_, "no_mapper": without})
    assert all(c.passed for c in passed)
    assert [c.runs for c in passed] == [3, 3]
    assert passed[0].interval == (0, 3)  # one run's outlier is shown, not decisive
    twice = [replace(r, variant="mapper") for r in without]  # runs without, fed as both
    failed = fig4_testbed.claims({"mapper": twice, "no_mapper": without})
    assert failed and not any(c.passed for c in failed)


def test_the_testbeds_ratio_is_of_the_medians_and_needs_retransmissions_to_compare() -> None:
    with_ = [_run("mapper", 0, 0.2), _run("mapper", 0, 0.9), _run("mapper", 0, 0.1)]
    without = [_run("no_mapper", 1050, 0.8), _run("no_mapper", 990, 0.4), _run("no_mapper", 9, 1)]
    ratio = fig4_testbed.claims({"mapper": with_, "no_mapper": without})[1]
    assert ratio.value == pytest.approx(0.2 / 0.8) and ratio.passed
    assert ratio.interval == pytest.approx((0.1 / 1, 0.9 / 0.4))
    none = [_run("no_mapper", 1050, 0.0)] * 3
    assert not fig4_testbed.claims({"mapper": with_, "no_mapper": none})[1].passed

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


def test_the_testbeds_claim_passes_with_the_mapper_and_fails_without() -> None:
    """Measured here: with the mapper no data packet crossed the bad links; without it,
    687-1,643 did in 3 s."""
    with_ = [_run("mapper", 0, 0.2), _run("mapper", 0, 0.1), _run("mapper", 3, 0.5)]
    without = [
        _run("no_mapper", 1050, 0.8),
        _run("no_mapper", 990, 0.9),
        _run("no_mapper", 1020, 0.7),
    ]
    (passed,) = fig4_testbed.claims({"mapper": with_, "no_mapper": without})
    assert passed.passed and passed.runs == 3
    assert passed.interval == (0, 3)  # one run's outlier is shown, not decisive
    twice = [replace(r, variant="mapper") for r in without]  # runs without, fed as both
    (failed,) = fig4_testbed.claims({"mapper": twice, "no_mapper": without})
    assert not failed.passed


def test_the_counting_rules_name_both_ends_of_each_link() -> None:
    assert fig4_testbed.counting_rules("p0:t0a-t1b") == [
        ("p0-t0a", "fcbb:bb00:1000:2001::/64"),
        ("p0-t1b", "fcbb:bb00:2001:1000::/64"),
    ]

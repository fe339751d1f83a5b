"""The mapper study's claims are computed from its runs: a localizer that needs far more
evidence, and a threshold no loss reaches, fail them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mrcstack.experiments import EXPERIMENTS, simruns
from mrcstack.sim import SimConfig, SimResult
from mrcstack.sim.config import MapperSpec


def test_claims_fail_when_the_mapper_judges_too_late(monkeypatch: pytest.MonkeyPatch) -> None:
    real = simruns.sim_run

    def blunt(cfg: SimConfig) -> SimResult:
        assert isinstance(cfg.mapper, MapperSpec)
        return real(replace(cfg, mapper=replace(cfg.mapper, down_after=12, loss_threshold=0.3)))

    monkeypatch.setattr(simruns, "sim_run", blunt)
    study = next(e for e in EXPERIMENTS if e.name == "mapper-localization")
    outcome = study.run("quick", 1)
    down, gray, exact, _ = outcome.claims
    assert not down.passed and not gray.passed and not exact.passed

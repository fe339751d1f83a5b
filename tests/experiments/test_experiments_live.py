"""The testbed's figures on the kernel (root): each runs in its quick profile (every stack
3 times) and leaves its claims, data and plots; every claim passes as shipped and fails
with mrcd's QP on one EV through the fault; the report collects them."""

from __future__ import annotations

from pathlib import Path

import pytest

from mrcstack.experiments import EXPERIMENTS, Experiment, testbedruns
from mrcstack.experiments.base import Mechanism
from tests.support.experiments import check_index, check_passes_as_shipped, check_result, run_quick

pytestmark = pytest.mark.requires_root

TESTBED = [e for e in EXPERIMENTS if e.where == "testbed"]


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_quick(tmp_path_factory.mktemp("experiments"), TESTBED)


@pytest.mark.timeout(900)  # the first one runs every testbed figure (the module's fixture)
@pytest.mark.parametrize("exp", TESTBED, ids=lambda e: e.name)
def test_each_testbed_figure_leaves_claims_data_and_plots(out: Path, exp: Experiment) -> None:
    check_result(out, exp)


@pytest.mark.parametrize("exp", TESTBED, ids=lambda e: e.name)
def test_every_testbed_claim_credits_a_mechanism_and_passes_as_shipped(
    out: Path, exp: Experiment
) -> None:
    check_passes_as_shipped(out, exp)


def test_the_report_collects_the_testbed_figures(out: Path) -> None:
    check_index(out, TESTBED)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("exp", TESTBED, ids=lambda e: e.name)
def test_testbed_claims_fail_with_one_ev_through_the_fault(
    monkeypatch: pytest.MonkeyPatch, exp: Experiment
) -> None:
    """mrcd without spraying (its QP's one EV on the path the fault takes away), one run
    per stack: every claim fails (as shipped they pass: the test above)."""
    monkeypatch.setattr(testbedruns, "RUNS", (1, 1))
    outcome = exp.run("quick", 1, Mechanism.SPRAYING)
    assert outcome.claims and not [c for c in outcome.claims if c.passed]
    assert outcome.params["mrcd_one_ev"]

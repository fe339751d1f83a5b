"""``mrcstack experiment``: every experiment runs in its quick profile and leaves its claims,
data and plots; the report collects them; bad names get one line."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from mrcstack.experiments import EXPERIMENTS, Claim, simruns
from mrcstack.experiments.cli import main
from mrcstack.experiments.live import FaultCase, Run
from mrcstack.experiments.testbedruns import claims, outcome
from mrcstack.sim import SimConfig, run, scenario
from tests.support import REPO

ROOT = REPO
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("experiments")
    assert main(["run", "--quick", "--out", str(folder)]) == 0
    return folder


def test_claims_compare_their_value_with_the_threshold() -> None:
    assert Claim("x", 0.95, 0.9).passed and not Claim("x", 0.85, 0.9).passed
    assert Claim("x", 1.2, 1.5, "<=").passed and not Claim("x", 1.6, 1.5, "<=").passed
    assert not Claim("x", math.nan, 0.0).passed  # a figure that could not be measured fails
    assert Claim("x", math.inf, 1.0).to_json()["value"] is None  # JSON stays strict
    assert Claim("x", 1.0, 1.0, "<=").to_json()["op"] == "<="  # the text JSON has always had
    with pytest.raises(ValueError):
        Claim("x", 1.0, 1.0, "<")  # an unknown comparison fails loudly


@pytest.mark.timeout(900)  # the first one runs every experiment (the module's fixture)
@pytest.mark.parametrize(
    "exp",
    [
        pytest.param(e, id=e.name, marks=[pytest.mark.requires_root] if e.needs_root else [])
        for e in EXPERIMENTS
    ],
)
def test_each_experiment_leaves_claims_data_and_plots(out: Path, exp: object) -> None:
    name = exp.name  # type: ignore[attr-defined]
    folder = out / name
    doc = json.loads((folder / "result.json").read_text())
    assert doc["name"] == name and doc["params"]
    assert doc["figure"].startswith(("Fig", "Section"))
    assert doc["profile"] == "quick" and doc["seed"] == 1 and doc["revision"] and doc["machine"]
    assert doc["rerun"] == f"mrcstack experiment run {name} --quick --seed 1"
    assert doc["claims"], "an experiment states at least one number"
    for c in doc["claims"]:
        assert set(c) == {"text", "value", "threshold", "op", "pass"}
        assert isinstance(c["value"], int | float) and math.isfinite(c["value"]), c
        ok = c["value"] >= c["threshold"] if c["op"] == ">=" else c["value"] <= c["threshold"]
        assert c["pass"] is ok
    for table, data in doc["data"].items():
        with (folder / f"{table}.csv").open() as f:
            rows = list(csv.reader(f))
        assert rows[0] == data["columns"] and len(rows) - 1 == len(data["rows"]) > 0
    assert doc["plots"]
    for plot in doc["plots"]:
        png = (folder / plot).read_bytes()
        assert png.startswith(PNG) and len(png) > 10_000  # drawn, not empty
    if exp.where == "sim":  # type: ignore[attr-defined]
        assert doc["scenarios"], "every simulator run is kept as a scenario file"
        for path in doc["scenarios"]:
            assert isinstance(scenario.load(folder / path), SimConfig)


def test_a_kept_scenario_reruns_to_the_same_numbers(out: Path) -> None:
    folder = out / "fig14-shared-ev"
    doc = json.loads((folder / "result.json").read_text())
    # Runs in order: the flow alone, then the cases of the "flows" table.
    rows = doc["data"]["flows"]["rows"]
    for path, row in zip(doc["scenarios"][1:], rows, strict=True):
        again = run(scenario.load(folder / path))
        assert [f.goodput_bps / 1e9 for f in again.flows] == pytest.approx(row[1:3], rel=1e-9)


def _no_ecn(cfg: SimConfig) -> SimConfig:
    """Switches that never mark: what fig14's ECN steering needs is gone."""
    queue = cfg.fabric.queue_bytes
    return replace(cfg, ecn_kmin_bytes=queue - 2, ecn_kmax_bytes=queue - 1)


def _mrc_as_roce(cfg: SimConfig) -> SimConfig:
    """Every MRC run runs RoCE mode instead: what fig18's spraying gives is gone."""
    return replace(cfg, mode="roce") if cfg.mode == "mrc" else cfg


def _lossy_everywhere(cfg: SimConfig) -> SimConfig:
    """The one lossy EV's loss on every link: no healthy EV is left to move to."""
    return replace(cfg, loss=0.2) if cfg.ev_loss else cfg


def _lossy(cfg: SimConfig) -> SimConfig:
    """2% loss on every link: small writes' latency is no longer flat."""
    return replace(cfg, loss=0.02)


def _tiny(sim: simruns.Sim, quick: int, full: int) -> int:
    """An eighth of the quick profile's sizes, one seed or trial: for the slow figures
    whose sizes are bytes (not fault times), checked to pass their claims at this size."""
    return quick // 8 if quick > 8 else 1


@pytest.mark.parametrize(
    ("name", "sabotage", "claims", "tiny"),
    [
        ("fig9a-link-flaps", _mrc_as_roce, (0,), False),
        ("fig9b-nic-down-up", _mrc_as_roce, (0,), False),
        ("fig9c-many-links", _mrc_as_roce, (0, 1), False),
        ("fig9d-t1-fail", _mrc_as_roce, (0,), False),
        ("fig10-11-switch-fail", _mrc_as_roce, (0,), False),
        ("fig12-lossy-ev", _lossy_everywhere, (0,), False),
        ("fig14-shared-ev", _no_ecn, (1,), False),
        ("fig16-collectives", _mrc_as_roce, (0, 1), True),
        ("fig18-incast", _mrc_as_roce, (0, 3, 4), False),
        ("fig20-permutation", _mrc_as_roce, (0, 2), True),
        ("latency-small-writes", _lossy, (0,), True),
    ],
    ids=lambda v: getattr(v, "__name__", str(v)).strip("_"),
)
def test_claims_fail_when_the_runs_lose_what_they_claim(
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    sabotage: Callable[[SimConfig], SimConfig],
    claims: tuple[int, ...],
    tiny: bool,
) -> None:
    """The claims are computed from the runs: feed the figure runs that lack the mechanism
    a claim credits, and that claim must fail (the quick profile's own runs pass them:
    the report test above)."""
    real = simruns.sim_run
    monkeypatch.setattr(simruns, "sim_run", lambda cfg: real(sabotage(cfg)))
    if tiny:
        monkeypatch.setattr(simruns.Sim, "size", _tiny)
    figure = next(e for e in EXPERIMENTS if e.name == name)
    assert figure.where == "sim"
    outcome = figure.run("quick", 1)
    for i in claims:
        assert not outcome.claims[i].passed, outcome.claims[i]


def test_the_report_collects_every_plot_and_claim(out: Path) -> None:
    text = (out / "index.md").read_text()
    ran = [e for e in EXPERIMENTS if os.geteuid() == 0 or not e.needs_root]
    docs = [json.loads((out / e.name / "result.json").read_text()) for e in ran]
    claims = [c for d in docs for c in d["claims"]]
    passed = sum(c["pass"] for c in claims)
    assert f"{len(docs)} experiments, {passed} of {len(claims)} claims pass." in text
    assert "Profile `quick`, seed 1, " in text and docs[0]["machine"] in text
    for d in docs:
        assert f"Rerun: `{d['rerun']}`" in text
    for d in docs:
        for plot in d["plots"]:
            assert f"]({d['name']}/{plot})" in text
        for c in d["claims"]:
            assert c["text"] in text


def test_the_simulated_figures_show_what_the_paper_shows(out: Path) -> None:
    """The physics the claims rest on, each a clear margin from its threshold."""

    def value(name: str, i: int) -> float:
        return float(json.loads((out / name / "result.json").read_text())["claims"][i]["value"])

    assert 0.4 < value("fig9b-nic-down-up", 0) < 0.6  # 4 of 8 ports: goodput halves
    assert value("fig9b-nic-down-up", 2) > 0.9  # and comes back
    assert value("fig9a-link-flaps", 2) > 0.2  # MRC rides through flaps RoCE stalls on
    assert value("fig20-permutation", 2) > 2  # spraying beats one hashed path per flow


def test_list_and_bad_names() -> None:
    listed = subprocess.run(
        [sys.executable, "-m", "mrcstack", "experiment", "list"],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    assert listed.returncode == 0
    lines = listed.stdout.splitlines()
    assert len(lines) == len(EXPERIMENTS)
    for line, e in zip(lines, EXPERIMENTS, strict=True):
        assert line.startswith(e.name) and e.figure in line and e.where in line
    bad = subprocess.run(
        [sys.executable, "-m", "mrcstack", "experiment", "run", "fig99"],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "fig99" in bad.stderr
    none = subprocess.run(
        [sys.executable, "-m", "mrcstack", "experiment", "run", "fig12-lossy-ev",
         "--where", "testbed"],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    assert none.returncode == 2 and "testbed" in none.stderr


# The testbed's figures: claims computed from the runs' series ---------------------------------
def _series(rate_bps: float, gap: tuple[float, float] = (0.0, 0.0)) -> Run:
    """A transfer around a fault at t=100 s: 256 KiB completions at ``rate_bps``, none in
    ``gap`` (seconds after the fault)."""
    fault = 100.0
    step = (256 << 10) * 8 / rate_bps
    samples = []
    t = fault - 2.0
    while t < fault + 2.0:
        if not gap[0] <= t - fault < gap[1]:
            samples.append((t, 256 << 10))
        t += step
    return Run("x", tuple(samples), fault, {}, None, 0.0)


CASE = FaultCase("t", "a test fault", lambda f: None)


def _figures(mrcd_gap: tuple[float, float], mptcp_gap: tuple[float, float]) -> dict[str, Any]:
    runs = {"mrcd": [_series(700e6, mrcd_gap)], "tcp": [_series(200e6)],
            "mptcp": [_series(500e6, mptcp_gap)]}  # fmt: skip
    result, figures = outcome(runs, CASE, title="t", marks=())
    result.claims = claims(figures, "after the fault")
    return {"result": result, "figures": figures}


def test_testbed_claims_pass_when_mrcd_recovers_fast_and_mptcp_slowly() -> None:
    got = _figures(mrcd_gap=(0.0, 0.02), mptcp_gap=(0.0, 0.6))
    figures = got["figures"]
    assert figures["mrcd"]["lost_ms"] == pytest.approx(20, abs=6)
    assert figures["mptcp"]["lost_ms"] == pytest.approx(600, abs=20)
    assert figures["mptcp"]["recovery_ms"] >= 550
    assert all(c.passed for c in got["result"].claims)
    table = next(t for t in got["result"].tables if t.name == "goodput")
    assert table.columns == ("time_ms", "mrcd", "tcp", "mptcp")


def test_testbed_claims_fail_when_the_data_says_so() -> None:
    got = _figures(mrcd_gap=(0.0, 0.4), mptcp_gap=(0.0, 0.05))  # mrcd is the slow one
    passed = [c.passed for c in got["result"].claims]
    assert passed == [False, False, False]


def test_recovery_from_a_lasting_fault_counts_from_the_end_of_the_step_that_ends_it() -> None:
    """Ports brought back are back when the command has finished (addresses, routes): a
    run that recorded that time is measured from it, one that did not from ``back_at_s``."""
    same = _series(700e6, (0.0, 0.7))  # back at the same time, 0.7 s after the fault
    runs = {"mrcd": [replace(same, steps_ms=(650.0,))], "tcp": [_series(200e6)],
            "mptcp": [same]}  # fmt: skip
    _, figures = outcome(runs, CASE, title="t", marks=(), back_at_s=0.6)
    mrcd, mptcp = figures["mrcd"]["recovery_ms"], figures["mptcp"]["recovery_ms"]
    assert 0 < mrcd < mptcp <= 150 and mptcp - mrcd == pytest.approx(50)
    assert figures["mrcd"]["restore_ms"] == pytest.approx(50)  # the step ended 50 ms late
    assert figures["mptcp"]["restore_ms"] == 0.0

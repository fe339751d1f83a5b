"""``mrcstack experiment`` without root: every simulated and design experiment runs in its
quick profile and leaves its claims, data and plots, every claim passes as shipped and
fails without the mechanism it credits; the testbed's claims from synthetic runs; the
report collects them and lists the paper's figures; bad names get one line.  The testbed's
figures on the kernel: ``test_experiments_live.py``."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from mrcstack.experiments import EXPERIMENTS, Claim, Experiment, cli, simruns, testbedruns
from mrcstack.experiments.base import Mechanism, Op, Outcome, Table
from mrcstack.experiments.cli import main
from mrcstack.experiments.figures import fig9b_testbed
from mrcstack.experiments.live import FaultCase, Run
from mrcstack.experiments.plots import bars
from mrcstack.experiments.testbedruns import Placed, claims, outcome
from mrcstack.sim import run, scenario
from tests.support import REPO
from tests.support.experiments import (
    check_index,
    check_passes_as_shipped,
    check_result,
    result,
    run_quick,
    simulations_remembered,
)

ROOT = REPO
#: What runs without root: the simulator's figures and the design arithmetic.
UNPRIVILEGED = [e for e in EXPERIMENTS if not e.needs_root]
#: The 64-host figures, run here with the first of their quick profile's two seeds (about
#: 75 s saved; ``make experiments`` runs both, and docs/experiments/agreement.md has ten
#: such runs agreeing).
ONE_SEED = {"fig6-transceiver-flap", "fig8-t1-reboot"}


@pytest.fixture(scope="module", autouse=True)
def budget() -> Iterator[None]:
    """The suite has a time budget: each simulator configuration is simulated once in this
    module (a figure run without a mechanism reruns only what its absence changes),
    :data:`ONE_SEED`'s figures run with one seed, and the report runs two at a time."""
    seeds = simruns.Sim.seeds

    def one_seed(sim: simruns.Sim, quick: int, full: int) -> list[int]:
        return [sim.seed] if sim.name in ONE_SEED else seeds(sim, quick, full)

    with simulations_remembered(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(simruns.Sim, "seeds", one_seed)
        yield


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_quick(tmp_path_factory.mktemp("experiments"), UNPRIVILEGED, jobs=2)


def test_claims_compare_their_value_with_the_threshold() -> None:
    assert Claim("x", 0.95, 0.9).passed and not Claim("x", 0.85, 0.9).passed
    assert Claim("x", 1.2, 1.5, "<=").passed and not Claim("x", 1.6, 1.5, "<=").passed
    assert not Claim("x", math.nan, 0.0).passed  # a figure that could not be measured fails
    assert Claim("x", math.inf, 1.0).to_json()["value"] is None  # JSON stays strict
    assert Claim("x", 1.0, 1.0, "<=").to_json()["op"] == "<="  # the text JSON has always had
    with pytest.raises(ValueError):
        Claim("x", 1.0, 1.0, "<")  # an unknown comparison fails loudly
    near = Claim("x", 0.59, 0.5, Op.WITHIN, tolerance=0.2)  # a paper's number, reproduced
    assert near.passed and near.condition == "within 20% of 0.5"
    assert not Claim("x", 0.61, 0.5, Op.WITHIN, tolerance=0.2).passed
    assert not Claim("x", 0.39, 0.5, Op.WITHIN, tolerance=0.2).passed
    with pytest.raises(ValueError):
        Claim("x", 1.0, 1.0, Op.WITHIN)  # a "within" says how near
    doc = Claim("x", 2.0, 1.0, credits="mrc", interval=(1.0, 3.0), runs=3).to_json()
    assert (doc["credits"], doc["interval"], doc["runs"]) == ("mrc", [1.0, 3.0], 3)
    with pytest.raises(ValueError):
        Claim("x", 1.0, 1.0, credits="luck")  # an unknown mechanism fails loudly


@pytest.mark.timeout(900)  # the first one runs every experiment (the module's fixture)
@pytest.mark.parametrize("exp", UNPRIVILEGED, ids=lambda e: e.name)
def test_each_experiment_leaves_claims_data_and_plots(out: Path, exp: Experiment) -> None:
    check_result(out, exp)


@pytest.mark.parametrize("exp", UNPRIVILEGED, ids=lambda e: e.name)
def test_every_claim_credits_a_mechanism_and_passes_as_shipped(out: Path, exp: Experiment) -> None:
    """The quick profile's runs (:data:`ONE_SEED` with one seed), unsabotaged: every claim
    passes (the tests below take the mechanism away and see it fail), and credits a
    mechanism the experiment can run without."""
    check_passes_as_shipped(out, exp)


def test_a_kept_scenario_reruns_to_the_same_numbers(out: Path) -> None:
    folder = out / "fig14-shared-ev"
    doc = json.loads((folder / "result.json").read_text())
    # Runs in order: the flow alone, then the cases of the "flows" table.
    rows = doc["data"]["flows"]["rows"]
    for path, row in zip(doc["scenarios"][1:], rows, strict=True):
        again = run(scenario.load(folder / path))
        assert [f.goodput_bps / 1e9 for f in again.flows] == pytest.approx(row[1:3], rel=1e-9)


def _tiny(sim: simruns.Sim, quick: int, full: int) -> int:
    """An eighth of the quick profile's sizes: for the slow figures whose sizes are bytes
    (not fault times); they are run unsabotaged at this size too, and must pass."""
    return quick // 8 if quick > 8 else 1


#: Figures whose sizes are bytes, run at an eighth of the quick profile here (fig16's
#: chunks at that size are too short to separate the stacks: it runs as shipped).
TINY = {"fig20-permutation", "latency-small-writes"}
SABOTAGES = [
    pytest.param(e, m, id=f"{e.name}-without-{m}")
    for e in EXPERIMENTS
    if e.where in ("sim", "design", "sim+testbed")
    for m in e.mechanisms
]


@pytest.mark.parametrize(("exp", "mechanism"), SABOTAGES)
def test_claims_fail_without_the_mechanism_they_credit(
    monkeypatch: pytest.MonkeyPatch, exp: Experiment, mechanism: Mechanism
) -> None:
    """Run the figure without the mechanism (RoCE mode for MRC, trimming or ECN off, one
    plane): every claim crediting it fails.  The quick profile's sizes and seeds, except
    :data:`TINY` and :data:`ONE_SEED`; the tiny ones must also pass as shipped at their
    size (the others pass at the quick profile's: the report test above)."""
    # One testbed run of each variant (Fig 4's half, as root): without the mapper every
    # run sends hundreds of packets across the bad links, and the suite has a budget.
    monkeypatch.setattr(testbedruns, "RUNS", (1, 1))
    if exp.name in TINY:
        monkeypatch.setattr(simruns.Sim, "size", _tiny)
        shipped = exp.run("quick", 1, None)
        assert all(c.passed for c in shipped.claims), [c for c in shipped.claims if not c.passed]
    outcome = exp.run("quick", 1, mechanism)
    crediting = [c for c in outcome.claims if c.credits is mechanism]
    assert crediting, f"no claim of {exp.name} credits {mechanism}"
    assert not [c for c in crediting if c.passed], [c for c in crediting if c.passed]


def test_the_report_collects_every_plot_and_claim(out: Path) -> None:
    text = check_index(out, UNPRIVILEGED)
    assert "reproduced: [design-arithmetic](#design-arithmetic)" in text
    assert "reproduced by fig9a-testbed (not run for this report)" in text


def test_the_simulated_figures_show_what_the_paper_shows(out: Path) -> None:
    """The physics the claims rest on, each a clear margin from its threshold."""

    def value(name: str, i: int) -> float:
        return float(json.loads((out / name / "result.json").read_text())["claims"][i]["value"])

    assert 0.4 < value("fig9b-nic-down-up", 0) < 0.6  # 4 of 8 ports: goodput halves
    assert value("fig9b-nic-down-up", 1) > 0.9  # and comes back
    assert value("fig9a-link-flaps", 1) > 0.4  # MRC rides through flaps RoCE stalls on
    assert value("fig20-permutation", 1) > 2  # spraying beats one hashed path per flow
    assert value("fig8-t1-reboot", 1) == pytest.approx(0.25, abs=0.05)  # a quarter of QPs
    assert value("design-arithmetic", 1) == pytest.approx(0.6)  # 3/5 of the switches


def _experiment(*args: str) -> subprocess.CompletedProcess[str]:
    """``mrcstack experiment ARGS...`` as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "mrcstack", "experiment", *args],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip


def test_list_and_bad_names() -> None:
    listed = _experiment("list")
    assert listed.returncode == 0
    lines = listed.stdout.splitlines()
    assert len(lines) == len(EXPERIMENTS)
    for line, e in zip(lines, EXPERIMENTS, strict=True):
        assert line.startswith(e.name) and e.figure in line and e.where in line
    bad = _experiment("run", "fig99")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "fig99" in bad.stderr
    none = _experiment("run", "fig12-lossy-ev", "--where", "testbed")
    assert none.returncode == 2 and "testbed" in none.stderr
    wrong = _experiment("run", "fig12-lossy-ev", "--without", "trimming")
    assert wrong.returncode == 2 and "credit trimming" in wrong.stderr
    for jobs in ("0", "two"):
        zero = _experiment("run", "fig12-lossy-ev", "--jobs", jobs)
        assert zero.returncode == 2 and zero.stderr.count("\n") == 1 and "--jobs" in zero.stderr


#: The simulator itself, not the module's remembered runs.
REAL_SIM_RUN = simruns.sim_run


def _where_it_ran(profile: str, seed: int, without: Mechanism | None) -> Outcome:
    """An experiment's run that states the process it ran in, and when."""
    return Outcome({"pid": os.getpid(), "at": time.monotonic()}, claims=[Claim("ran", 1.0, 1.0)])


def _where(name: str, where: str) -> Experiment:
    return Experiment(name, "Fig 0", "where it ran", where, _where_it_ran)


def test_jobs_run_simulations_side_by_side_to_the_same_report_and_testbeds_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--jobs 2`` gives the report one process gives (the simulator is deterministic),
    in the order asked for; a figure that uses the testbed runs in the command's own
    process, after the others, never beside them."""
    monkeypatch.setattr(simruns, "sim_run", REAL_SIM_RUN)  # each report simulates
    names = ["fig18-incast", "fig12-lossy-ev", "fig9b-nic-down-up"]
    for jobs in ("1", "2"):
        assert main(["run", *names, "--quick", "--jobs", jobs, "--out", str(tmp_path / jobs)]) == 0
    for name in names:
        one, two = (json.loads((tmp_path / j / name / "result.json").read_text()) for j in "12")
        assert one.pop("seconds") >= 0 and two.pop("seconds") >= 0
        assert one == two
    index = (tmp_path / "2" / "index.md").read_text()
    assert [index.index(f"Rerun: `mrcstack experiment run {n}") for n in names] == sorted(
        index.index(f"Rerun: `mrcstack experiment run {n}") for n in names
    )
    fakes = [_where("sim-a", "sim"), _where("bed", "sim+testbed"), _where("sim-b", "design")]
    monkeypatch.setattr(cli, "EXPERIMENTS", fakes)
    monkeypatch.setattr(cli, "index", lambda out, docs, *rest: str(out))
    assert main(["run", "--jobs", "2", "--out", str(tmp_path / "fake")]) == 0
    ran = {f.name: result(tmp_path / "fake", f)["params"] for f in fakes}
    assert ran["bed"]["pid"] == os.getpid()
    assert os.getpid() not in (ran["sim-a"]["pid"], ran["sim-b"]["pid"])
    assert ran["bed"]["at"] > max(ran["sim-a"]["at"], ran["sim-b"]["at"])


def test_jobs_start_the_longest_figures_first(tmp_path: Path) -> None:
    """Each as long as it took the last time it wrote to the folder in this profile; one
    without such a run (never, another profile, an unreadable result) before all."""
    names = ["short", "long", "other-profile", "never", "broken", "middle"]
    last = {"short": ("quick", 1.0), "long": ("quick", 90.0), "middle": ("quick", 30.0),
            "other-profile": ("full", 500.0)}  # fmt: skip
    for name, (profile, seconds) in last.items():
        (tmp_path / name).mkdir()
        doc = {"profile": profile, "seconds": seconds}
        (tmp_path / name / "result.json").write_text(json.dumps(doc))
    for name, text in (("broken", "{"), ("a-list", "[1]")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "result.json").write_text(text)
    order = cli.longest_first([_where(n, "sim") for n in [*names, "a-list"]], tmp_path, "quick")
    want = ["other-profile", "never", "broken", "a-list", "long", "middle", "short"]
    assert [e.name for e in order] == want


def test_a_run_without_a_mechanism_says_so_and_its_claims_fail(tmp_path: Path) -> None:
    assert main(["run", "design-arithmetic", "--without", "planes", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "design-arithmetic" / "result.json").read_text())
    assert doc["without"] == "planes" and doc["rerun"].endswith("--without planes")
    assert doc["claims"] and not any(c["pass"] for c in doc["claims"])
    assert (
        "Run **without planes** (one plane at the NIC's whole rate"
        in (tmp_path / "index.md").read_text()
    )


def _report(folder: Path, verdicts: list[bool]) -> Path:
    """A report folder with one experiment whose claims pass as ``verdicts`` say."""
    (folder / "x").mkdir(parents=True)
    doc = {
        "name": "x", "profile": "quick", "seed": 1, "revision": "git abc", "seconds": 2.5,
        "claims": [{"text": f"claim {i}", "value": float(i), "pass": v}
                   for i, v in enumerate(verdicts)],
    }  # fmt: skip
    (folder / "x" / "result.json").write_text(json.dumps(doc))
    return folder


def test_agree_tells_claims_that_changed_verdict_between_reports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one = _report(tmp_path / "1", [True, True])
    two = _report(tmp_path / "2", [True, False])
    assert main(["agree", str(one), str(two)]) == 0
    out = capsys.readouterr().out
    assert "2 reports (profile quick, seed 1, git abc): 2 claims, 1 with the same verdict" in out
    assert "| x | claim 0 | pass 0 | pass 0 | yes |" in out
    assert "| x | claim 1 | pass 1 | FAIL 1 | **no** |" in out
    assert main(["agree", str(tmp_path / "none")]) == 2
    assert "no results in" in capsys.readouterr().err


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


PLACED = Placed(FaultCase("t", "a test fault", lambda f: None), (), (0, 0))


def _figures(
    mrcd_gaps: list[tuple[float, float]], mptcp_gaps: list[tuple[float, float]]
) -> dict[str, Any]:
    """Claims from runs of mrcd and MPTCP with these gaps (one run each)."""
    runs = {"mrcd": [_series(700e6, g) for g in mrcd_gaps],
            "tcp": [_series(200e6) for _ in mrcd_gaps],
            "mptcp": [_series(500e6, g) for g in mptcp_gaps]}  # fmt: skip
    result, figures = outcome(runs, PLACED, title="t")
    result.claims = claims(figures, "after the fault")
    return {"result": result, "figures": figures}


def test_testbed_claims_pass_when_mrcd_recovers_fast_and_mptcp_slowly() -> None:
    got = _figures([(0.0, 0.02), (0.0, 0.03), (0.0, 0.01)], [(0.0, 0.6)] * 3)
    figures = got["figures"]
    assert figures["mrcd"]["lost_ms"] == pytest.approx(20, abs=6)  # the median run's
    assert (
        figures["mrcd"]["lost_ms_lo"] < figures["mrcd"]["lost_ms"] < figures["mrcd"]["lost_ms_hi"]
    )
    assert figures["mptcp"]["lost_ms"] == pytest.approx(600, abs=20)
    assert figures["mptcp"]["recovery_ms"] >= 550
    assert all(c.passed for c in got["result"].claims)
    assert all(c.runs == 3 and c.interval is not None for c in got["result"].claims)
    lost = got["result"].claims[1]
    assert lost.value == pytest.approx(20 / 600, rel=0.3) and lost.interval[0] < lost.value
    table = next(t for t in got["result"].tables if t.name == "goodput")
    assert table.columns[:4] == ("time_ms", "mrcd", "mrcd_lo", "mrcd_hi")


def test_testbed_claims_fail_when_the_data_says_so() -> None:
    got = _figures([(0.0, 0.4)], [(0.0, 0.05)])  # mrcd is the slow one
    passed = [c.passed for c in got["result"].claims]
    assert passed == [False, False]


def test_testbed_claims_fail_on_a_tie() -> None:
    """mrcd and MPTCP alike (the fault missed both, say): the comparisons fail."""
    got = _figures([(0.0, 0.02)], [(0.0, 0.02)])
    passed = [c.passed for c in got["result"].claims]
    assert passed == [True, False]


def test_fig9b_testbed_claims_take_the_capacity_left_and_a_single_path_fails_them() -> None:
    """While two of four planes' ports are down a spraying QP keeps half the capacity, and
    all of it once they are back; one path (a quarter of the capacity) fails both."""
    cap = testbedruns.CAPACITY_MBPS * 1e6

    def runs(before: float, during: float, after: float) -> list[Run]:
        parts = [_series(r) for r in (before, during, after)]
        cut = [(-2.0, 0.0), (0.0, fig9b_testbed.DOWN_S), (fig9b_testbed.DOWN_S, 2.0)]
        samples = tuple(
            (t, n) for p, (a, b) in zip(parts, cut, strict=True) for t, n in p.samples
            if a <= t - p.fault_at < b
        )  # fmt: skip
        return [replace(parts[0], samples=samples)] * 3

    def verdicts(mrcd: list[Run]) -> list[bool]:
        return [c.passed for c in fig9b_testbed._claims(mrcd)]

    assert verdicts(runs(0.85 * cap, 0.45 * cap, 0.85 * cap)) == [True, True]
    assert verdicts(runs(0.25 * cap, 0.001 * cap, 0.25 * cap)) == [False, False]


def test_recovery_from_a_lasting_fault_counts_from_the_end_of_the_step_that_ends_it() -> None:
    """Ports brought back are back when the command has finished (addresses, routes): a
    run that recorded that time is measured from it, one that did not from ``back_at_s``."""
    same = _series(700e6, (0.0, 0.7))  # back at the same time, 0.7 s after the fault
    runs = {"mrcd": [replace(same, steps_ms=(650.0,))], "tcp": [_series(200e6)],
            "mptcp": [same]}  # fmt: skip
    _, figures = outcome(runs, replace(PLACED, back_at_s=0.6), title="t")
    mrcd, mptcp = figures["mrcd"]["recovery_ms"], figures["mptcp"]["recovery_ms"]
    assert 0 < mrcd < mptcp <= 150 and mptcp - mrcd == pytest.approx(50)
    assert figures["mrcd"]["restore_ms"] == pytest.approx(50)  # the step ended 50 ms late
    assert figures["mptcp"]["restore_ms"] == 0.0


def test_error_bars_of_equal_values_draw(tmp_path: Path) -> None:
    """The mean of three equal values rounds above them (0.1 + 0.1 + 0.1 over 3): the bars
    still draw (the full profile's fig16 once stopped here)."""
    mean = sum([0.1] * 3) / 3
    assert mean > 0.1
    rows = (("a", mean, 0.1, 0.1), ("b", 2.0, 1.0, 3.0))
    table = Table("t", ("case", "y", "y min", "y max"), rows)
    draw = bars("t", "case", ["y"], ylabel="y", title="t", errs={"y": ("y min", "y max")})
    draw(tmp_path / "t.png", {"t": table})
    assert (tmp_path / "t.png").read_bytes().startswith(b"\x89PNG")

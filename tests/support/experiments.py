"""A quick report of ``mrcstack experiment run`` as the tests read it: what every
experiment must leave in it (claims, data, plots, scenarios), and the report's index."""

from __future__ import annotations

import csv
import json
import math
import multiprocessing
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from mrcstack.experiments import Experiment, simruns
from mrcstack.experiments.cli import main
from mrcstack.experiments.report import PAPER
from mrcstack.sim import SimConfig, SimResult, scenario

PNG = b"\x89PNG\r\n\x1a\n"


def run_quick(folder: Path, experiments: list[Experiment], jobs: int = 1) -> Path:
    """``experiments`` run in the quick profile, seed 1, their report in ``folder``."""
    names = [e.name for e in experiments]
    assert main(["run", "--quick", "--out", str(folder), "--jobs", str(jobs), *names]) == 0
    return folder


@contextmanager
def simulations_remembered() -> Iterator[None]:
    """Every simulator run of an experiment kept by its configuration while the block runs,
    and a run of the same configuration answered from it (a copy).  The simulator is
    deterministic (``test_a_kept_scenario_reruns_to_the_same_numbers``), so a figure run
    without a mechanism simulates only what taking the mechanism away changed: its RoCE
    baseline, say, is the run the shipped figure already made.  The runs are kept in a
    manager process, so the processes of ``run --jobs`` (forked, this patch included) keep
    theirs for the tests that come after."""
    real = simruns.sim_run
    with multiprocessing.get_context("fork").Manager() as manager:
        kept = manager.dict()

        def run(cfg: SimConfig) -> SimResult:
            key = repr(cfg)  # every field, floats exactly
            found: SimResult | None = kept.get(key)  # a copy: a figure may sort or trim it
            if found is None:
                found = real(cfg)
                kept[key] = found
            return found

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(simruns, "sim_run", run)
            yield


def result(out: Path, exp: Experiment) -> dict[str, Any]:
    """``exp``'s result.json in the report ``out``."""
    doc: dict[str, Any] = json.loads((out / exp.name / "result.json").read_text())
    return doc


def check_result(out: Path, exp: Experiment) -> None:
    """``exp`` left its parameters, claims (each its verdict on its number), the data of
    every table as CSV, every plot drawn, and (in the simulator) a scenario per run."""
    folder = out / exp.name
    doc = result(out, exp)
    assert doc["name"] == exp.name and doc["params"]
    assert doc["figure"].startswith(("Fig", "Section", "Design"))
    assert doc["profile"] == "quick" and doc["seed"] == 1 and doc["revision"] and doc["machine"]
    assert doc["rerun"] == f"mrcstack experiment run {exp.name} --quick --seed 1"
    assert doc["claims"], "an experiment states at least one number"
    keys = {"text", "value", "threshold", "op", "tolerance", "condition", "pass", "credits"}
    for c in doc["claims"]:
        assert set(c) == keys | {"interval", "runs"}
        assert isinstance(c["value"], int | float) and math.isfinite(c["value"]), c
        if c["op"] == "within":
            ok = abs(c["value"] - c["threshold"]) <= c["tolerance"] * abs(c["threshold"])
        else:
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
    if exp.where == "sim":
        assert doc["scenarios"], "every simulator run is kept as a scenario file"
        for path in doc["scenarios"]:
            assert isinstance(scenario.load(folder / path), SimConfig)


def check_passes_as_shipped(out: Path, exp: Experiment) -> None:
    """Unsabotaged, every claim of ``exp`` passes and credits a mechanism the experiment
    can run without."""
    assert exp.mechanisms
    for c in result(out, exp)["claims"]:
        assert c["credits"] in {m.value for m in exp.mechanisms}, c
        assert c["pass"], c


def check_index(out: Path, ran: list[Experiment]) -> str:
    """The report's index.md counts, links and states everything ``ran`` left, and lists
    every figure of the paper; its text."""
    text = (out / "index.md").read_text()
    docs = [result(out, e) for e in ran]
    claims = [c for d in docs for c in d["claims"]]
    passed = sum(c["pass"] for c in claims)
    assert f"{len(docs)} experiments, {passed} of {len(claims)} claims pass." in text
    assert "Profile `quick`, seed 1, " in text and docs[0]["machine"] in text
    for d in docs:
        assert f"Rerun: `{d['rerun']}`" in text
        for plot in d["plots"]:
            assert f"]({d['name']}/{plot})" in text
        for c in d["claims"]:
            assert c["text"] in text
    for figure in PAPER:  # every figure of the paper, and where it stands
        assert f"| {figure.ref} | {figure.shows} | " in text
    return text

"""``mrcstack experiment``: every experiment runs in its quick profile and leaves its claims,
data and plots; the report collects them; bad names get one line."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from mrcstack.experiments import EXPERIMENTS, Claim
from mrcstack.experiments.cli import main

ROOT = Path(__file__).resolve().parents[1]
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


@pytest.mark.parametrize("exp", EXPERIMENTS, ids=lambda e: e.name)
def test_each_experiment_leaves_claims_data_and_plots(out: Path, exp: object) -> None:
    name = exp.name  # type: ignore[attr-defined]
    folder = out / name
    doc = json.loads((folder / "result.json").read_text())
    assert doc["name"] == name and doc["params"] and doc["figure"].startswith("Fig")
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


def test_the_report_collects_every_plot_and_claim(out: Path) -> None:
    text = (out / "index.md").read_text()
    docs = [json.loads((out / e.name / "result.json").read_text()) for e in EXPERIMENTS]
    claims = [c for d in docs for c in d["claims"]]
    passed = sum(c["pass"] for c in claims)
    assert f"{len(docs)} experiments, {passed} of {len(claims)} claims pass." in text
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
        [sys.executable, "-m", "mrcstack", "experiment", "run", "--where", "testbed"],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    assert none.returncode == 2 and "testbed" in none.stderr

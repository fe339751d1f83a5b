"""What operators get with the package (``monitoring/``): Prometheus alert rules that
promtool accepts and whose unit tests (synthetic series that fire and clear every alert)
pass, and a Grafana dashboard over mrcd's metrics.  Its queries run against live daemons in
tests/daemons/test_operator.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from mrcstack.resources import find
from tests.support import REPO
from tests.support.monitoring import DASHBOARD, RULES, dashboard_queries, rule_exprs

PROMTOOL = shutil.which("promtool")
ALERT_TESTS = REPO / "tests" / "daemons" / "data" / "alerts_test.yml"
_METRIC = re.compile(r"\b(mrc_[a-z0-9_]+|up)\b")


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.requires_program("promtool")
def test_promtool_checks_the_alert_rules(tmp_path: Path) -> None:
    done = promtool("check", "rules", str(RULES), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 13 rules found" in done.stdout


@pytest.mark.requires_program("promtool")
def test_every_alert_fires_and_clears_on_synthetic_series(tmp_path: Path) -> None:
    """promtool test rules: each alert firing (labels and rendered annotations exactly) while
    its series are bad, and gone once they are healthy."""
    shutil.copy(RULES, tmp_path / RULES.name)
    shutil.copy(ALERT_TESTS, tmp_path / ALERT_TESTS.name)
    done = promtool("test", "rules", ALERT_TESTS.name, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    tested = set(re.findall(r"alertname: (\w+)", ALERT_TESTS.read_text()))
    defined = set(re.findall(r"- alert: (\w+)", RULES.read_text()))
    assert tested == defined and len(defined) == 13


def _names(expr: str) -> set[str]:
    found = set(_METRIC.findall(expr))
    return {re.sub(r"_(total|bucket|sum|count)$", "", n) for n in found} - {"up"}


def test_dashboard_and_rules_use_only_metrics_mrcd_exports() -> None:
    readme = (REPO / "README.md").read_text()  # lists every metric family (test_metrics)
    exprs = [q.expr for q in dashboard_queries()]
    exprs += rule_exprs()
    assert len(exprs) > 30
    for expr in exprs:
        for name in _names(expr):
            assert f"`{name}`" in readme or f"`{name}_total`" in readme, (name, expr)


def test_the_dashboard_shows_what_operators_need() -> None:
    doc = json.loads(DASHBOARD.read_text())
    panels = [p for p in doc["panels"] if p["type"] != "row"]
    assert all(p.get("description") for p in panels)  # every panel says what it shows
    assert len({p["id"] for p in doc["panels"]}) == len(doc["panels"])
    assert [v["name"] for v in doc["templating"]["list"]] == ["datasource", "instance"]
    exprs = " ".join(q.expr for q in dashboard_queries())
    for needle in (
        "rate(mrc_placed_bytes_total",  # goodput
        "sum by (reason) (rate(mrc_retransmissions_total",
        "sum by (state) (mrc_evs",
        "rate(mrc_ev_state_changes_total",  # demotions
        "sum by (reason) (increase(mrc_peer_failures_total",  # dead peers
        "sum by (reason) (rate(mrc_rejected_packets_total",
        "sum by (auth) (rate(mrc_probe_answers_total",  # answered, apart from the rejected
        "sum by (reason) (rate(mrc_control_rejections_total",
    ):
        assert needle in exprs, needle


def test_both_ship_with_the_package() -> None:
    for path in (DASHBOARD, RULES):
        shipped = find(f"monitoring/{path.name}")
        assert shipped is not None and shipped.read_text() == path.read_text()

"""The shipped dashboard's and alert rules' PromQL, as tests read and run it."""

from __future__ import annotations

import json
from dataclasses import dataclass

from tests.support import REPO

DASHBOARD = REPO / "monitoring" / "grafana-dashboard.json"
RULES = REPO / "monitoring" / "prometheus-alerts.yml"


@dataclass(frozen=True)
class Query:
    panel: str
    expr: str

    def promql(self, window: str) -> str:
        """The expression as Grafana sends it with every daemon selected and ``window`` as
        its rate interval."""
        return self.expr.replace("$instance", ".*").replace("$__rate_interval", window)


def dashboard_queries() -> list[Query]:
    doc = json.loads(DASHBOARD.read_text())
    return [
        Query(panel["title"], target["expr"])
        for panel in doc["panels"]
        for target in panel.get("targets", [])
    ]


def rule_exprs() -> list[str]:
    """Every ``expr`` of the alert rules (single-line or folded with ``>-``)."""
    lines = RULES.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        key, _, value = line.strip().partition(" ")
        if key != "expr:":
            continue
        if value != ">-":
            out.append(value)
            continue
        indent = len(line) - len(line.lstrip())
        body = []
        for follow in lines[i + 1 :]:
            if len(follow) - len(follow.lstrip()) <= indent:
                break
            body.append(follow.strip())
        out.append(" ".join(body))
    return out

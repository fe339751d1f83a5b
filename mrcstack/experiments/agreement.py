"""Whether several reports agree: ``mrcstack experiment agree DIR...`` reads each report's
``NAME/result.json`` files and prints one Markdown table, a row per claim and a column per
report, each cell the claim's pass or fail and its value, and says which claims changed
their verdict between reports.  Ten reports of the quick profile in a row, agreeing on
every claim, are the evidence that a claim is not decided by noise."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

Key = tuple[str, int]  # (experiment, claim index)


def load(report: Path) -> dict[str, dict[str, Any]]:
    """Every experiment's result in one report folder, by name."""
    docs = {}
    for path in sorted(report.glob("*/result.json")):
        doc = json.loads(path.read_text())
        docs[doc["name"]] = doc
    if not docs:
        raise ValueError(f"no results in {report} (expected NAME/result.json files)")
    return docs


def _cell(c: dict[str, Any] | None) -> str:
    if c is None:
        return "-"
    value = "n/a" if c["value"] is None else f"{c['value']:.3g}"
    return f"{'pass' if c['pass'] else 'FAIL'} {value}"


def table(reports: list[Path]) -> str:
    """The Markdown table over ``reports`` (in the order given) and a summary line."""
    runs = [load(r) for r in reports]
    names = list(dict.fromkeys(n for docs in runs for n in docs))
    rows: list[str] = []
    agree = differ = 0
    for name in names:
        count = max(len(docs[name]["claims"]) for docs in runs if name in docs)
        for i in range(count):
            cells = [
                docs[name]["claims"][i] if name in docs and i < len(docs[name]["claims"]) else None
                for docs in runs
            ]
            verdicts = {c["pass"] for c in cells if c is not None}
            same = len(verdicts) == 1 and all(c is not None for c in cells)
            agree += same
            differ += not same
            text = next(c["text"] for c in cells if c is not None)
            rows.append(
                f"| {name} | {text} | {' | '.join(_cell(c) for c in cells)} | "
                f"{'yes' if same else '**no**'} |"
            )
    seconds = [sum(d["seconds"] for d in docs.values()) for docs in runs]
    passed = [sum(c["pass"] for d in docs.values() for c in d["claims"]) for docs in runs]
    first = next(iter(runs[0].values()))
    head = [
        f"{len(runs)} reports (profile {first['profile']}, seed {first['seed']}, "
        f"{first['revision']}): {agree + differ} claims, {agree} with the same verdict in "
        f"every report, {differ} not.",
        "",
        "| experiment | claim | "
        + " | ".join(f"run {k + 1}" for k in range(len(runs)))
        + " | same |",
        "|---|---|" + "---|" * len(runs) + "---|",
        "| | claims passed | " + " | ".join(str(p) for p in passed) + " | |",
        "| | seconds | " + " | ".join(f"{s:.0f}" for s in seconds) + " | |",
    ]
    return "\n".join(head + rows) + "\n"

"""The report, ``DIR/index.md``: how it was made, the paper's figures and where each one
stands, every plot with its claims, and a pass/fail summary."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mrcstack.experiments.base import SCENARIOS, RunInfo


@dataclass(frozen=True, slots=True)
class PaperFigure:
    """One figure (or number) of the paper's design and evaluation sections: what it
    shows there, the experiments that reproduce it, and otherwise why not (or "to do")."""

    ref: str
    shows: str
    experiments: tuple[str, ...] = ()
    otherwise: str = ""


#: Every figure and number of the paper's design and evaluation sections, in its order.
PAPER: tuple[PaperFigure, ...] = (
    PaperFigure(
        "Design",
        "8 x 100G planes and radix-512 switches: 131,072 GPUs in two tiers, 2/3 of the optics "
        "and 3/5 of the switches of three tiers; a lost T0-T1 link costs 0.4% of a node (3% "
        "with one 800G plane)",
        ("design-arithmetic",),
    ),
    PaperFigure(
        "Fig 4",
        "a 75K-GPU job starts with the fabric mapper's denylists: under 5 packets lost per QP "
        "in the first minute",
        ("fig4-job-start",),
        "to do: needs the fabric mapper's denylist in the simulator",
    ),
    PaperFigure(
        "Fig 6",
        "a transceiver flaps for a minute under a 50K-GPU job: about a 25% dip",
        ("fig6-transceiver-flap",),
    ),
    PaperFigure(
        "Fig 8",
        "a T1 reboots: about a quarter of QPs affected, 580K packets dropped, forwarding back "
        "within 2 minutes",
        ("fig8-t1-reboot",),
    ),
    PaperFigure(
        "Fig 9a",
        "NIC-T0 and T0-T1 links down in turn, then back",
        ("fig9a-link-flaps", "fig9a-testbed"),
    ),
    PaperFigure(
        "Fig 9b",
        "4 of 8 NIC links flap together: about half",
        ("fig9b-nic-down-up", "fig9b-testbed"),
    ),
    PaperFigure(
        "Fig 9c",
        "20 T0-T1 links taken down 1 s apart: minimal impact",
        ("fig9c-many-links",),
        "",
    ),
    PaperFigure(
        "Fig 9d", "T0-T1 links fail at once: negligible impact", ("fig9d-t1-fail", "fig9d-testbed")
    ),
    PaperFigure("Fig 10", "a T0 fails: one plane's share lost", ("fig10-11-switch-fail",)),
    PaperFigure(
        "Fig 11", "a T1 fails and returns: no steady-state loss", ("fig10-11-switch-fail",)
    ),
    PaperFigure(
        "Figs 12-13", "one EV drops 20%: replaced at once, bandwidth flat", ("fig12-lossy-ev",)
    ),
    PaperFigure("Fig 14", "two flows on one EV: ECN moves one off", ("fig14-shared-ev",)),
    PaperFigure(
        "Figs 16-17",
        "ring all-reduce and all-to-all at 0, 0.1 and 1% loss, MRC 1 QP against RoCE 1 and 16 QPs",
        ("fig16-collectives",),
    ),
    PaperFigure("Fig 18", "7:1 incast and a victim flow", ("fig18-incast",)),
    PaperFigure("Fig 20", "permutation traffic across racks", ("fig20-permutation",)),
    PaperFigure(
        "Section 5.2.1",
        "perftest: 96% of line rate; 5.09 us within a T0, 6.54 us across a T1",
        ("latency-small-writes",),
        "",
    ),
    PaperFigure(
        "Section 5.2.1 (hardware)",
        "the absolute numbers: 96% of 400G line rate, 5.09 / 6.54 us",
        (),
        "not reproducible here: software endpoints on veth, where the kernel and Python set "
        "the microseconds (the simulator's latency CDF reproduces the shape)",
    ),
    PaperFigure(
        "Operations",
        "the fabric mapper probes every link about every millisecond",
        (),
        "to do: the fabric mapper",
    ),
    PaperFigure(
        "Figs 1-3, 5, 7, 15, 19, 21-22",
        "the paper's other figures",
        (),
        "to do: not described in the summary of the paper this report works from; to be "
        "classified from the paper itself",
    ),
)


def paper_table(ran: Sequence[str], registered: Sequence[str]) -> list[str]:
    """The paper's figures as a Markdown table: reproduced (linking the experiments of
    this report), registered but not run here, or why not."""
    lines = ["| paper | what it shows | here |", "|---|---|---|"]
    for f in PAPER:
        done = [e for e in f.experiments if e in ran]
        known = [e for e in f.experiments if e in registered and e not in ran]
        parts = [f"reproduced: {', '.join(f'[{e}](#{e})' for e in done)}"] if done else []
        if known:
            parts.append(f"reproduced by {', '.join(known)} (not run for this report)")
        if not parts:
            parts.append(f.otherwise or "to do")
        lines.append(f"| {f.ref} | {f.shows} | {'; '.join(parts)} |")
    return lines


def number(v: float | None) -> str:
    """A claim's number as the report prints it: three significant figures, whole numbers
    of four digits or more in full."""
    if v is None:
        return "n/a"
    if float(v).is_integer() and abs(v) >= 1000:
        return f"{int(v):,}"
    return f"{v:.3g}"


def _value(c: dict[str, Any]) -> str:
    text = number(c["value"])
    if c.get("interval"):
        lo, hi = (number(v) for v in c["interval"])
        text += f" [{lo}, {hi}]"
    return text


def _claims(d: dict[str, Any]) -> list[str]:
    lines = [
        "| claim | credits | value | runs | threshold | pass |",
        "|---|---|---|---|---|---|",
    ]
    for c in d["claims"]:
        lines.append(
            f"| {c['text']} | {c.get('credits') or '-'} | {_value(c)} | {c.get('runs') or 1} | "
            f"{c['condition']} | {'PASS' if c['pass'] else 'FAIL'} |"
        )
    return lines


def index(
    out: Path,
    docs: Sequence[dict[str, Any]],
    info: RunInfo,
    skipped: Sequence[str] = (),
    registered: Sequence[str] = (),
) -> Path:
    """``out/index.md``: how it was made, the paper's figures, every plot with its claims
    table, and a pass/fail summary.  ``registered``: every experiment there is."""
    claims = [c for d in docs for c in d["claims"]]
    passed = sum(1 for c in claims if c["pass"])
    without = (
        [
            f"Run **without {info.without}** ({info.without.without}): every claim crediting "
            "it is expected to fail.",
            "",
        ]
        if info.without
        else []
    )
    lines = [
        "# mrcstack experiments",
        "",
        f"{len(docs)} experiments, {passed} of {len(claims)} claims pass.",
        "",
        f"Profile `{info.profile}`, seed {info.seed}, {info.revision}; {info.machine}. "
        "Each section names the command that reruns it.",
        "",
        *without,
        *([f"Skipped (need root): {', '.join(skipped)}.", ""] if skipped else []),
        "| experiment | figure | where | claims passed | seconds |",
        "|---|---|---|---|---|",
    ]
    for d in docs:
        ok = sum(1 for c in d["claims"] if c["pass"])
        lines.append(
            f"| [{d['name']}](#{d['name']}) | {d['figure']} | {d['where']} | "
            f"{ok}/{len(d['claims'])} | {d['seconds']} |"
        )
    lines += [
        "",
        "## The paper's figures",
        "",
        "Every figure and number of the paper's design and evaluation sections, and where "
        "it stands here.",
        "",
        *paper_table([d["name"] for d in docs], registered),
        "",
        "## Reading a claim",
        "",
        "Each claim credits one mechanism (its *credits* column). `mrcstack experiment run "
        "NAME --without MECHANISM` runs the figure with it taken away, and the claims "
        "crediting it fail: mrc (RoCE mode instead), spraying (one path per connection), "
        "trimming (switches drop), ecn (switches never mark), planes (one plane of the "
        "NIC's whole rate). A comparison states the margin it must win by, so a tie fails. "
        "A claim decided over several runs (the testbed's, each stack several times) "
        "shows the median and, in brackets, the lowest and highest run.",
    ]
    for d in docs:
        lines += ["", f"## {d['name']}", "", f"{d['figure']}: {d['shows']}", ""]
        lines += [f"![{p}]({d['name']}/{p})" for p in d["plots"]]
        lines += ["", *_claims(d)]
        lines += [f"- {n}" for n in d["notes"]]
        params = ", ".join(f"{k}={v}" for k, v in d["params"].items())
        lines += ["", f"Parameters: {params}.", "", f"Rerun: `{d['rerun']}`"]
        if d.get("scenarios"):
            lines += [
                "",
                f"Its {len(d['scenarios'])} simulator runs, one scenario file each: "
                f"`{d['name']}/{SCENARIOS}/`; `mrcstack sim --scenario FILE` reruns one.",
            ]
    path = out / "index.md"
    path.write_text("\n".join(lines) + "\n")
    return path

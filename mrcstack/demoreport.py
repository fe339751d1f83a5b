"""The demo's results: /metrics sampling, the per-second table and the summary.

Pure apart from :func:`scrape` (one HTTP GET): :func:`report` turns a finished :class:`Run`
(the tools' JSON, the fault log, samples of h0's and h3's ``/metrics``, what mrcd logged)
into the document ``mrcstack demo --json`` prints, :func:`render` into the text table.
``mrcstack/demo.py`` runs the demo.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

SRC, DST = 0, 3
WRITE = "1MiB"
SAMPLE_PERIOD = 0.25
#: The async events that say a connection failed.
FATAL_EVENTS = ("qp_fatal", "device_fatal")
_SAMPLE = re.compile(r"^(\w+)(?:\{([^}]*)\})? (\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


# Metrics ------------------------------------------------------------------------------------
def scrape(url: str) -> dict[tuple[str, str], float]:
    """``{(name, first label value or ""): value}`` of one /metrics page."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    out: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            labels = _LABEL.findall(m.group(2) or "")
            out[(m.group(1), labels[0][1] if labels else "")] = float(m.group(3))
    return out


def family(sample: dict[tuple[str, str], float], name: str) -> dict[str, float]:
    return {label: v for (n, label), v in sample.items() if n == name and label}


class Sampler:
    """Scrapes h0 and h3 every SAMPLE_PERIOD in a thread: ``(unix time, {host: sample})``."""

    def __init__(self, urls: dict[int, str]) -> None:
        self.urls = urls
        self.samples: list[tuple[float, dict[int, dict[tuple[str, str], float]]]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def take(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.samples.append((time.time(), {h: scrape(u) for h, u in self.urls.items()}))

    def run(self) -> None:
        while not self.done.is_set():
            self.take()
            self.done.wait(SAMPLE_PERIOD)

    def at(self, when: float, host: int, name: str) -> dict[str, float]:
        """One family of ``host`` at unix time ``when``, linearly interpolated."""
        if not self.samples:
            return {}
        before = [s for s in self.samples if s[0] <= when]
        after = [s for s in self.samples if s[0] >= when]
        a = before[-1] if before else self.samples[0]
        b = after[0] if after else self.samples[-1]
        fa, fb = family(a[1][host], name), family(b[1][host], name)
        if b[0] <= a[0]:
            return fb
        w = (when - a[0]) / (b[0] - a[0])
        return {k: fa.get(k, 0.0) + (fb.get(k, 0.0) - fa.get(k, 0.0)) * w for k in fb}


# The table -------------------------------------------------------------------------------------
def group(notes: Sequence[tuple[float, str, str]]) -> list[str]:
    """``+2.15 link down a, b``: consecutive (time, action, target) of one action merged."""
    out: list[tuple[float, str, list[str]]] = []
    for t, action, target in notes:
        if out and out[-1][1] == action:
            out[-1][2].append(target)
        else:
            out.append((t, action, [target]))
    return [
        f"+{t:.2f} {action} {', '.join(x for x in targets if x)}".rstrip()
        for t, action, targets in out
    ]


def short(text: str) -> tuple[str, str]:
    """A scenario event as (action, target): ``("link down", "p0:t0a-t1a")``."""
    text = text.replace(" (automatic restore)", "")
    action, _, rest = text.partition(" ")
    words = [
        w.split("=", 1)[1] if w.startswith(("a=", "switch=", "host=")) else w for w in rest.split()
    ]
    words = [w.replace("plane=", "plane ") for w in words]
    return action.replace("_", " "), " ".join(words)


@dataclass
class Run:
    duration: float
    client: dict[str, Any] = field(default_factory=dict)
    server: dict[str, Any] = field(default_factory=dict)
    faults: list[dict[str, Any]] = field(default_factory=list)  # {"wall", "text"}
    sampler: Sampler | None = None
    before: dict[int, dict[tuple[str, str], float]] = field(default_factory=dict)
    after: dict[int, dict[tuple[str, str], float]] = field(default_factory=dict)
    #: What h0's and h3's mrcd logged as connection failures (FAILED_LOG lines).
    logged_failures: list[str] = field(default_factory=list)
    #: The fabric mapper's status at the end (its history of link states), if it ran.
    mapper: dict[str, Any] | None = None


def connection_failures(run: Run) -> list[str]:
    """Every sign that the connection failed: mrcd's log lines and the tools' fatal events."""
    tools = [
        f"h{host} app event {e['type']}: {e.get('reason', '')}"
        for host, doc in ((SRC, run.client), (DST, run.server))
        for e in doc.get("events", [])
        if e.get("type") in FATAL_EVENTS
    ]
    return [*run.logged_failures, *tools]


#: The demo's mapper holds a recovered link for this long (10 s by default): short enough
#: to see the flapped links come back within the run.
MAPPER_HOLD_S = 2.0


def report(run: Run) -> dict[str, Any]:
    """The per-second rows, per-plane bytes and retransmissions of a finished run."""
    c, s = run.client, run.server
    start = float(c["start_time"])
    seconds = max(1, round(float(c["duration_s"])))  # a last partial second only if >= 0.5 s
    sampler = run.sampler
    rows = []
    for k in range(seconds):
        lo, hi = start + k, start + k + 1
        goodput = sum(e["bytes"] for e in c["series"] if k < e["t"] <= k + 1 + 1e-9)
        planes: dict[str, float] = {}
        retx = 0.0
        if sampler is not None:
            a, b = (
                sampler.at(lo, SRC, "mrc_sent_bytes_total"),
                sampler.at(hi, SRC, "mrc_sent_bytes_total"),
            )
            planes = {p: b[p] - a.get(p, 0.0) for p in sorted(b, key=int)}
            ra = sampler.at(lo, SRC, "mrc_retransmissions_total")
            rb = sampler.at(hi, SRC, "mrc_retransmissions_total")
            retx = sum(rb.values()) - sum(ra.values())
        notes = [
            (f["wall"] - start, f["action"], f["target"])
            for f in run.faults
            if lo <= f["wall"] < hi
        ]
        notes += [
            (e["wall"] - start, f"h{DST} app event {e['type']}", f"port {e['port']}")
            for e in s.get("events", [])
            if lo <= e["wall"] < hi and e.get("port") is not None
        ]
        rows.append(
            {
                "t": k,
                "goodput_gbit_s": round(goodput * 8 / 1e9, 3),
                "sent_gbit_s": {p: round(v * 8 / 1e9, 3) for p, v in planes.items()},
                "retransmissions": round(retx),
                "faults": group(sorted(notes)),
            }
        )
    sent0 = family(run.before[SRC], "mrc_sent_bytes_total")
    sent1 = family(run.after[SRC], "mrc_sent_bytes_total")
    recv0 = family(run.before[DST], "mrc_received_bytes_total")
    recv1 = family(run.after[DST], "mrc_received_bytes_total")
    retx0 = family(run.before[SRC], "mrc_retransmissions_total")
    retx1 = family(run.after[SRC], "mrc_retransmissions_total")
    planes_total = {
        p: {
            "h0_sent_bytes": round(sent1[p] - sent0.get(p, 0.0)),
            "h3_received_bytes": round(recv1.get(p, 0.0) - recv0.get(p, 0.0)),
        }
        for p in sorted(sent1, key=int)
    }
    return {
        "duration_s": c["duration_s"],
        "bytes": c["bytes"],
        "goodput_gbit_s": c["bw_average_gbit_s"],
        "peak_gbit_s": c["bw_peak_gbit_s"],
        "verified": s.get("verified", 0),
        "mismatches": s.get("mismatches", 0),
        "rows": rows,
        "planes": planes_total,
        "retransmissions": {r: round(retx1[r] - retx0.get(r, 0.0)) for r in retx1},
        "faults": [
            {"t": round(f["wall"] - start, 3), "action": f["action"], "target": f["target"]}
            for f in run.faults
        ],
        "connection_failures": connection_failures(run),
        "mapper": mapper_events(run.mapper, start),
    }


def mapper_events(status: dict[str, Any] | None, start: float) -> list[dict[str, Any]] | None:
    """What the fabric mapper said during the run: each link state change, +s from the
    start (a link in any state but up is denied on every mrcd)."""
    if status is None:
        return None
    return [
        {"t": round(c["time"] - start, 3), "link": c["link"], "state": c["state"]}
        for c in status["history"]
        if c["time"] >= start
    ]


def render(doc: dict[str, Any]) -> str:
    planes = list(doc["planes"])
    out = [
        "",
        f"mrc-write-bw h{SRC} -> h{DST} (different racks), 1 QP, {WRITE} writes, --verify: "
        f"{doc['bytes'] / 2**30:.2f} GiB in {doc['duration_s']:.1f} s, "
        f"{doc['goodput_gbit_s']:.2f} Gbit/s average, {doc['peak_gbit_s']:.2f} peak (100 ms)",
        "",
        f"  {'t':>3}  {'goodput':>8}  {'h0 sent per plane [Gbit/s]':^{7 * len(planes)}}  "
        f"{'retx':>5}  faults (+s from the start)",
        f"  {'[s]':>3}  {'[Gbit/s]':>8}  "
        + "".join(f"{'p' + p:>7}" for p in planes)
        + f"  {'':>5}",
    ]
    for row in doc["rows"]:
        sent = "".join(f"{row['sent_gbit_s'].get(p, 0.0):7.2f}" for p in planes)
        notes = "; ".join(row["faults"])
        out.append(
            f"  {row['t']:>3}  {row['goodput_gbit_s']:8.2f}  {sent}  "
            f"{row['retransmissions']:>5}  {notes}".rstrip()
        )
    total = sum(v["h0_sent_bytes"] for v in doc["planes"].values()) or 1
    out += ["", "  plane  h0 sent [MiB]  share  h3 received [MiB]"]
    for p, v in doc["planes"].items():
        out.append(
            f"  p{p:<5} {v['h0_sent_bytes'] / 2**20:13.1f}  {v['h0_sent_bytes'] / total:5.1%}"
            f"  {v['h3_received_bytes'] / 2**20:17.1f}"
        )
    retx = ", ".join(f"{r} {n}" for r, n in doc["retransmissions"].items())
    failures = doc["connection_failures"]
    if failures:
        failed = f"the connection FAILED ({len(failures)}): " + "; ".join(failures)
    else:
        failed = "the connection never failed (no failure in mrcd's logs or the tools' events)"
    events = doc.get("mapper")
    if events is not None:
        out += [
            "",
            f"  the fabric mapper (every loop every 10 ms, hold-down {MAPPER_HOLD_S:g} s), "
            "links not up are denied on every mrcd:",
        ]
        out += [
            f"  {e['t']:6.2f} s  {e['link']:<12} {e['state']}"
            + (
                ""
                if e.get("pushed_ms") is None
                else f" (denylist pushed {e['pushed_ms']} ms later)"
            )
            for e in events
        ] or ["  no link left up"]
    out += [
        "",
        f"  h0 retransmissions by reason: {retx}",
        f"  verified by h3: {doc['verified']} writes landed intact, {doc['mismatches']} mismatches",
        f"  {failed}",
        "",
    ]
    return "\n".join(out)

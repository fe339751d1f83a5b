"""``mrcctl probe``: EV probes to a host, one path per plane, like ping.

Each round probes every chosen plane at once (one ``ep_batch``); ``-c`` rounds ``-i``
seconds apart.  A line per probe names the plane, the EV and the path (its uSID address),
answered or not, then a summary per plane and EV: probes, answers, loss, RTT min/avg/max.
Ctrl-C ends the rounds early and still prints the summary, as ping does.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from typing import Any

from mrcstack import addrplan
from mrcstack.api.ctl import Controller
from mrcstack.daemons.mrcctl.output import show


@dataclass
class Target:
    """One plane and the EV probed on it, with what came back."""

    plane: int
    ev: int
    path: str = ""
    sent: int = 0
    rtts: list[float] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"plane {self.plane} ev {self.ev:#05x}"

    def summary(self) -> dict[str, Any]:
        rtts = self.rtts
        return {
            "plane": self.plane,
            "ev": self.ev,
            "path": self.path,
            "sent": self.sent,
            "answered": len(rtts),
            "loss": 1 - len(rtts) / self.sent if self.sent else 0.0,
            "rtt_min": min(rtts) if rtts else None,
            "rtt_avg": sum(rtts) / len(rtts) if rtts else None,
            "rtt_max": max(rtts) if rtts else None,
        }

    def summary_line(self) -> str:
        s = self.summary()
        line = f"{self.name}: {s['sent']} sent, {s['answered']} answered, {s['loss']:.0%} loss"
        if self.rtts:
            return line + (
                f", rtt min/avg/max {s['rtt_min'] * 1e3:.3f}/{s['rtt_avg'] * 1e3:.3f}/"
                f"{s['rtt_max'] * 1e3:.3f} ms"
            )
        return line + (f", path {self.path}" if self.path else "")


def _targets(args: argparse.Namespace, ctl: Controller) -> list[Target]:
    if args.ev is not None and args.plane is None:
        args.plane = addrplan.ev_fields(args.ev).plane
    if args.plane is not None:
        planes = [args.plane]
    else:
        planes = list(range(int(ctl.query_device()["planes"])))
    return [Target(p, args.ev if args.ev is not None else addrplan.ev_value(p, 0)) for p in planes]


def _round(
    args: argparse.Namespace, ctl: Controller, targets: list[Target], seq: int
) -> list[dict[str, Any]]:
    """One probe per target; a record (and, as text, a line) per probe."""
    requests = [
        {"req_id": i, "host": args.host, "plane": t.plane, "ev": t.ev}
        for i, t in enumerate(targets)
    ]
    r = ctl.ep_batch("ev_probe", requests, args.timeout)
    answers = {x["req_id"]: x for x in r["responses"]}
    records = []
    for i, t in enumerate(targets):
        t.sent += 1
        t.path = r.get("paths", {}).get(str(i)) or t.path
        x = answers.get(i)
        record: dict[str, Any] = {"seq": seq, "plane": t.plane, "ev": t.ev, "path": t.path}
        if x is not None:
            t.path = x.get("path") or t.path
            t.rtts.append(float(x["rtt"]))
            record |= {"rtt": x["rtt"], "via": x["via"], "path": t.path}
            text = f"rtt {x['rtt'] * 1e3:.3f} ms via {x['via']}"
            text += f", path {t.path}" if t.path else ""
        else:
            error = r["errors"].get(str(i))
            record["error"] = error or f"no answer in {args.timeout:g} s"
            if error is None or error.startswith("no reply"):
                text = f"no answer in {args.timeout:g} s" + (f", path {t.path}" if t.path else "")
            else:
                text = f"error: {error}"
        records.append(record)
        if not args.json:
            print(f"h{args.host} {t.name} seq {seq}: {text}", flush=True)
    return records


def run_probe(args: argparse.Namespace, ctl: Controller) -> int:
    """``-c`` rounds; exit status 1 when a probed path never answered."""
    targets = _targets(args, ctl)
    if not args.json and args.count > 1:
        print(
            f"PROBE h{args.host}: {len(targets)} plane(s), {args.count} probes each, "
            f"every {args.interval:g} s, timeout {args.timeout:g} s",
            flush=True,
        )
    records: list[dict[str, Any]] = []
    try:
        for seq in range(1, args.count + 1):
            began = time.monotonic()
            records += _round(args, ctl, targets, seq)
            if seq < args.count:
                time.sleep(max(0.0, args.interval - (time.monotonic() - began)))
    except KeyboardInterrupt:
        pass  # the summary of what was sent, as ping prints it
    summary = [t.summary() for t in targets if t.sent]
    text = "\n".join(
        [f"--- h{args.host} EV probe statistics ---", *(t.summary_line() for t in targets)]
    )
    if args.json:
        show(args, {"host": args.host, "probes": records, "summary": summary}, "")
    else:
        print(text, flush=True)
    return 0 if all(s["answered"] for s in summary) and summary else 1

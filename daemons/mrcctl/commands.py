"""mrcctl's commands: one function per object, each printing a table or mrcd's JSON."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from mrcstack.api.ctl import Controller
from mrcstack.daemons.mrcctl.cli import EV_FORMATS, PROG, UsageError, cc_config
from mrcstack.daemons.mrcctl.output import show, table
from mrcstack.daemons.mrcctl.probe import run_probe
from mrcstack.qpn import qpn_text


def event_line(doc: dict[str, Any]) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(float(doc.get("time", 0))))
    dropped = f" events_dropped={doc['events_dropped']}" if doc.get("events_dropped") else ""
    return (
        f"{stamp} profile={doc['profile_id']} qpn={qpn_text(doc['qpn'])} ev={doc['ev']:#x} "
        f"port={doc['port']} {doc['old_state']}->{doc['state']} reason={doc['reason']} "
        f"drops={doc['drop_count']}{dropped}"
    )


# Commands ---------------------------------------------------------------------------------------
def run(args: argparse.Namespace, ctl: Controller) -> int:
    if args.cmd == "caps":
        r = ctl.query_device()
        ev = r["ev"]
        human = "\n".join(
            [
                f"host {r['host_name']}, {r['planes']} ports (planes), "
                f"port mask {r['port_mask']:#x}",
                f"EV profiles: up to {ev['max_profiles']}, {ev['max_count_profile']} EVs each, "
                f"{ev['free_count']} of {ev['max_count']} EVs free, width {ev['max_width']} bits",
                f"EV format modes: {', '.join(ev['fmt_modes'])}; "
                f"EV modes: {', '.join(ev['ev_modes'])}",
                f"CC profiles: up to {r['cc']['max_profiles']}; "
                f"algorithms: {', '.join(r['cc']['algorithms'])}",
                f"optional: {', '.join(r['opt'])}",
            ]
        )
        show(args, r, human)
    elif args.cmd == "port":
        return run_port(args, ctl)
    elif args.cmd == "ev":
        return run_ev(args, ctl)
    elif args.cmd == "cc":
        return run_cc(args, ctl)
    elif args.cmd == "probe":
        return run_probe(args, ctl)
    elif args.cmd == "qp":
        return run_qp(args, ctl)
    return 0


def run_port(args: argparse.Namespace, ctl: Controller) -> int:
    if args.action == "show":
        ports = ctl.ports()
        rows = [(p["port"], p["admin"], p["link"], p["state"]) for p in ports]
        show(args, ports, table(rows, ("port", "admin", "link", "state")))
    elif args.action == "set":
        r = ctl.modify_port(args.port, args.state == "up")
        show(args, r, f"port {r['port']}: admin {r['admin']}, link {r['link']}, {r['state']}")
    else:
        r = ctl.port_status_update(args.host, args.status, args.timeout)
        ok = not r["timed_out"] and not r["errors"]
        human = "\n".join(
            [
                f"h{x['host']}: port status sent, answered in {x['rtt'] * 1e3:.3f} ms"
                for x in r["responses"]
            ]
            + [f"h{args.host}: {e}" for e in r["errors"].values()]
            + [f"h{args.host}: no answer in {args.timeout} s" for _ in r["timed_out"]]
        )
        show(args, r, human)
        return 0 if ok else 1
    return 0


def _mask(text: str | None) -> list[str] | None:
    return None if text is None else [s.strip() for s in text.split(",") if s.strip()]


def run_ev(args: argparse.Namespace, ctl: Controller) -> int:
    if args.what == "format":
        ids = [args.id] if args.id is not None else list(range(len(EV_FORMATS)))
        docs = [ctl.ev_format(i) for i in ids]
        texts = []
        for r in docs:
            fields = " | ".join(f"{f['name']}:{f['width']}" for f in r["fields"])
            ev_fields = ", ".join(
                f"{f['name']} bits {f['offset']}-{f['offset'] + f['width'] - 1}"
                for f in r["ev_fields"]
            )
            texts.append(
                "\n".join(
                    [
                        f"EV format {r['id']}: {r['mode']} (state {r['state']}), "
                        f"locator block {r['locator_block']}",
                        f"on the wire: {fields}",
                        f"EV fields: {ev_fields}",
                        *(f"{k}: {v}" for k, v in r["layouts"].items()),
                    ]
                )
            )
        show(args, docs[0] if args.id is not None else docs, "\n\n".join(texts))
    elif args.what == "profile":
        return run_ev_profile(args, ctl)
    elif args.what == "states":
        rows = ctl.ev_states(args.qp, args.profile)
        human = table(
            [
                (
                    qpn_text(r["qpn"]),
                    f"{r['ev']:#x}",
                    r["plane"],
                    r["state"],
                    "yes" if r["in_use"] else "no",
                    r["drop_count"],
                )
                for r in rows
            ],
            ("qpn", "ev", "plane", "state", "in_use", "drops"),
        )
        show(args, rows, human if rows else "no connected QPs")
    else:
        return run_events(args, ctl)
    return 0


def run_ev_profile(args: argparse.Namespace, ctl: Controller) -> int:
    a = args.action
    if a == "create":
        fields = {
            n: getattr(args, n) for n in ("t1", "plane", "entropy") if getattr(args, n) is not None
        }
        if args.evs is not None and fields:
            raise UsageError("give --evs (explicit) or field ranges (generated), not both")
        r = ctl.create_ev_profile(
            args.id,
            evs=args.evs,
            fields=fields,
            ev_count=args.ev_count,
            ev_min_active=args.min_active,
            event_mask=_mask(args.event_mask),
            ev_format=args.format,
        )
        show(
            args,
            r,
            f"EV profile {r['id']}: {r['mode']}, ev_count {r['ev_count']}, "
            f"ev_min_active {r['ev_min_active']}",
        )
    elif a == "show":
        if args.id is None:
            rows = ctl.ev_profiles()
            human = table(
                [
                    (
                        p["id"],
                        p["mode"],
                        p["format"],
                        p["ev_count"],
                        p["ev_min_active"],
                        ",".join(p["event_mask"]),
                        len(p["denied"]),
                    )
                    for p in rows
                ],
                ("id", "mode", "format", "ev_count", "min_active", "event_mask", "denied"),
            )
            show(args, rows, human)
        else:
            p = ctl.ev_profile(args.id)
            evs = p.get("evs")
            lines = [
                f"EV profile {p['id']}: {p['mode']}, format {p['format']}, "
                f"ev_count {p['ev_count']}, "
                f"ev_min_active {p['ev_min_active']}, "
                f"events on {','.join(p['event_mask'])}",
                f"denied: {' '.join(hex(v) for v in p['denied']) or '-'}; "
                f"QPs: {' '.join(map(qpn_text, p['qps'])) or '-'}",
                "EVs: per destination (the address plan's default)"
                if evs is None
                else f"EVs ({len(evs)}): " + " ".join(f"{v:#x}:{port}" for v, port in evs),
            ]
            show(args, p, "\n".join(lines))
    elif a == "set":
        r = ctl.modify_ev_profile(
            args.id,
            ev_min_active=args.min_active,
            event_mask=_mask(args.event_mask),
            ev_format=args.format,
        )
        show(
            args,
            r,
            f"EV profile {r['id']}: format {r['format']}, ev_min_active {r['ev_min_active']}, "
            f"events on {','.join(r['event_mask'])}",
        )
    elif a in ("deny", "allow"):
        r = ctl.deny(args.id, args.evs) if a == "deny" else ctl.allow(args.id, args.evs)
        show(
            args,
            r,
            f"EV profile {r['id']}: {len(r['evs'])} EV(s) {r['state']}, "
            f"{r['changed']} change(s) on running QPs",
        )
    else:
        ctl.destroy_ev_profile(args.id)
        show(args, {}, f"EV profile {args.id} destroyed")
    return 0


def run_events(args: argparse.Namespace, ctl: Controller) -> int:
    if not args.follow:
        events = ctl.recent_ev_events()
        show(args, events, "\n".join(event_line(e) for e in events) or "no EV events yet")
        return 0
    ctl.subscribe_ev_events()  # only new events are streamed
    for seen, doc in enumerate(ctl.ev_events(), 1):
        print(json.dumps(doc) if args.json else event_line(doc), flush=True)
        if args.count is not None and seen >= args.count:
            return 0
    sys.stderr.write(f"{PROG}: mrcd went away\n")
    return 1


def run_cc(args: argparse.Namespace, ctl: Controller) -> int:
    if args.action == "create":
        r = ctl.create_cc_profile(args.id, args.algorithm, **cc_config(args.params))
        show(
            args,
            r,
            f"CC profile {r['id']}: {r['algorithm']} "
            + " ".join(f"{k}={v}" for k, v in r["config"].items() if v is not None),
        )
    elif args.action == "show":
        rows = ctl.cc_profiles() if args.id is None else [ctl.cc_profile(args.id)]
        human = "\n".join(
            f"CC profile {p['id']}: {p['algorithm']} "
            + " ".join(f"{k}={v}" for k, v in p["config"].items() if v is not None)
            for p in rows
        )
        show(args, rows if args.id is None else rows[0], human)
    else:
        ctl.destroy_cc_profile(args.id)
        show(args, {}, f"CC profile {args.id} destroyed")
    return 0


def _ms(value: object) -> str:
    return "-" if not isinstance(value, int | float) else f"{value * 1e3:.3g}"


def _window(q: dict[str, object]) -> str:
    """Bytes in flight and the congestion window, in KiB ("-" before the QP connects)."""
    cwnd, in_flight = q.get("cwnd"), q.get("in_flight")
    if not isinstance(cwnd, int) or not isinstance(in_flight, int):
        return "-"
    return f"{in_flight >> 10}/{cwnd >> 10}"


def run_qp(args: argparse.Namespace, ctl: Controller) -> int:
    if args.action == "connect":
        r = ctl.connect_qp(
            args.qpn, args.host, args.remote_qpn, args.remote_psn, key=args.key,
            extensions=args.extensions,
        )  # fmt: skip
        ext = "with" if r["extensions"] else "without"
        show(args, r, f"QP {qpn_text(r['qpn'])}: {r['state']} to {r['remote_host']} QP "
                      f"{qpn_text(r['remote_qpn'])}, {ext} mrcstack's extension; "
                      f"its first PSN {r['psn']}")  # fmt: skip
        return 0
    qps = ctl.qps(args.qpn)
    rows = [
        (
            qpn_text(q["qpn"]),
            q["state"],
            q.get("worker", 0),  # (an mrcd from before data-path workers: its one process)
            q["remote_host"] or "-",
            "-" if q["remote_qpn"] is None else qpn_text(q["remote_qpn"]),
            q["writes_in_flight"],
            _ms(q["timeout"]),
            f"{q['linear_cnt']}+{q['exp_cnt']}",
            _ms(q.get("max_rto")),
            _ms(q.get("rto")),
            _ms(q.get("retry_budget")),
            _ms(q.get("ack_delay")),
            _window(q),
            q["failure"] or "",
        )
        for q in qps
    ]
    header = ("qpn", "state", "worker", "peer", "peer_qpn", "writes", "timeout_ms", "retries",
              "max_rto_ms", "rto_ms", "budget_ms", "ack_delay_ms", "inflight/cwnd_kib",
              "failure")  # fmt: skip
    show(args, qps if args.qpn is None else qps[0], table(rows, header) if rows else "no QPs")
    return 0

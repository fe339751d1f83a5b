"""``mrcctl``: the controller API from the command line (mrc_ctl.h for operators).

    mrcctl [--socket PATH] [--json] caps
    mrcctl port show | port set PORT up|down | port notify HOST [--status BITMAP]
    mrcctl ev format
    mrcctl ev profile create ID (--evs V:P,... | [--t1 A-B] [--plane A-B] [--entropy A-B])
                                [--ev-count N] [--min-active N] [--event-mask S,...]
    mrcctl ev profile show [ID] | set ID [--min-active N] [--event-mask S,...]
    mrcctl ev profile deny|allow ID EV... | destroy ID
    mrcctl ev states [--qp N] [--profile ID]
    mrcctl ev events [--follow] [--count N]
    mrcctl cc profile create ID [--algorithm A] [NAME=VALUE ...] | show [ID] | destroy ID
    mrcctl probe HOST [--plane P --ev EV] [--timeout S]

Ports are planes (0-based).  EVs are numbers (``0x1203``: entropy 1, plane 2, T1 3).
Changes need root; queries do not.  Errors are one line on stderr; the exit status is 2
for a bad command line and 1 when mrcd refuses or cannot be reached.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

from mrcstack import add_version_flag, addrplan
from mrcstack.api.ctl import Controller
from mrcstack.api.errors import ApiError
from mrcstack.fabric import parse_size
from mrcstack.wire import EvFormat

PROG = "mrcctl"
DURATION_KEYS = {"base_rtt", "target_delay", "adjust_period_threshold", "qa_threshold"}
_DURATION = re.compile(r"\s*([0-9.]+(?:e[+-]?[0-9]+)?)\s*(ns|us|ms|s)?\s*", re.I)
_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, None: 1.0}

#: EV format names, in format profile order (0 srv6, 1 srv6-srh, 2 stev).
EV_FORMATS = tuple(f.value for f in EvFormat)


class UsageError(Exception):
    """A bad command line (exit 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{PROG}: error: {message}\n")
        raise SystemExit(2)


# Argument types ---------------------------------------------------------------------------------
def number(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def host(text: str) -> int:
    m = re.fullmatch(r"h?(\d+)", text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(f"not a host (h3 or 3): {text!r}")
    return int(m.group(1))


def span(text: str) -> dict[str, int]:
    m = re.fullmatch(r"\s*(\w+)\s*(?:-\s*(\w+)\s*)?", text)
    if m is None:
        raise argparse.ArgumentTypeError(f"not a range (A-B or A): {text!r}")
    lo = number(m.group(1))
    return {"min": lo, "max": number(m.group(2)) if m.group(2) else lo}


def ev_list(text: str) -> list[tuple[int, int]]:
    out = []
    for item in text.split(","):
        value, _, port = item.partition(":")
        ev = number(value)
        out.append((ev, number(port) if port else addrplan.ev_fields(ev).plane))
    return out


def duration(text: str) -> float:
    m = _DURATION.fullmatch(text)
    if m is None:
        raise UsageError(f"not a duration (e.g. 100us, 2ms, 0.001): {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2).lower() if m.group(2) else None]


def cc_config(items: Sequence[str]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"CC parameter must be NAME=VALUE, got {item!r}")
        if key in DURATION_KEYS:
            config[key] = duration(value)
        elif key == "disable_qa":
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise UsageError(f"disable_qa: true or false, got {value!r}")
            config[key] = value.lower() in ("true", "1", "yes")
        else:
            try:
                config[key] = parse_size(value)
            except ValueError:
                raise UsageError(f"{key}: not a number: {value!r}") from None
    return config


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="MRC controller: ports, EV and CC profiles, EV events")
    add_version_flag(p)
    p.add_argument(
        "--socket", help="mrcd's API socket (default: $MRCD_SOCKET or the one in /run/mrcstack)"
    )
    p.add_argument("--json", action="store_true", help="print mrcd's answer as JSON")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    sub.add_parser("caps", help="controller capabilities (mrc_ctl_query_device)")

    port = sub.add_parser("port", help="NIC ports (planes)").add_subparsers(
        dest="action", required=True, parser_class=_Parser
    )
    port.add_parser("show", help="admin and link state of every port")
    pset = port.add_parser("set", help="administratively enable or disable a port")
    pset.add_argument("port", type=number)
    pset.add_argument("state", choices=["up", "down"])
    notify = port.add_parser("notify", help="PORT_STATUS_UPDATE: tell a host which ports are up")
    notify.add_argument("host", type=host)
    notify.add_argument("--status", type=number, help="port bitmap (default: the current one)")
    notify.add_argument("--timeout", type=float, default=1.0)

    ev = sub.add_parser("ev", help="EV format, EV profiles, states and events").add_subparsers(
        dest="what", required=True, parser_class=_Parser
    )
    fmt = ev.add_parser("format", help="EV format profiles: 0 srv6 (uSID), 1 srv6-srh, 2 stev")
    fmt.add_argument("id", type=number, nargs="?", help="one format profile (default: all)")
    prof = ev.add_parser("profile", help="EV profiles").add_subparsers(
        dest="action", required=True, parser_class=_Parser
    )
    create = prof.add_parser("create", help="an explicit (--evs) or generated EV profile")
    create.add_argument("id", type=number)
    create.add_argument("--evs", type=ev_list, help="explicit EVs: VALUE[:PORT],...")
    for name in ("t1", "plane", "entropy"):
        create.add_argument(f"--{name}", type=span, help=f"generated: {name} range A-B")
    create.add_argument("--ev-count", type=number)
    create.add_argument("--min-active", type=number)
    create.add_argument("--event-mask", help="states that raise EV events: good,assumed_bad,...")
    create.add_argument("--format", choices=EV_FORMATS, help="EV format (default srv6: uSID)")
    show = prof.add_parser("show", help="one profile with its EVs, or all")
    show.add_argument("id", type=number, nargs="?")
    pmod = prof.add_parser("set", help="change ev_min_active / event mask online")
    pmod.add_argument("id", type=number)
    pmod.add_argument("--min-active", type=number)
    pmod.add_argument("--event-mask")
    pmod.add_argument("--format", choices=EV_FORMATS, help="EV format, while no QP uses it")
    for verb in ("deny", "allow"):
        d = prof.add_parser(verb, help=f"{verb} EVs of a profile (running QPs follow)")
        d.add_argument("id", type=number)
        d.add_argument("evs", type=number, nargs="+")
    destroy = prof.add_parser("destroy", help="remove an unused EV profile")
    destroy.add_argument("id", type=number)
    states = ev.add_parser("states", help="EV states of connected QPs")
    states.add_argument("--qp", type=number)
    states.add_argument("--profile", type=number)
    events = ev.add_parser("events", help="EV events: recent ones, or a live stream")
    events.add_argument("--follow", action="store_true", help="stream events until interrupted")
    events.add_argument("--count", type=number, help="with --follow: stop after N new events")

    cc = sub.add_parser("cc", help="CC profiles").add_subparsers(
        dest="what", required=True, parser_class=_Parser
    )
    ccp = cc.add_parser("profile", help="CC profiles").add_subparsers(
        dest="action", required=True, parser_class=_Parser
    )
    cc_create = ccp.add_parser("create", help="NSCC parameters: base_rtt=100us max_cwnd=1MiB ...")
    cc_create.add_argument("id", type=number)
    cc_create.add_argument("--algorithm", default="nscc")
    cc_create.add_argument("params", nargs="*", metavar="NAME=VALUE")
    cc_show = ccp.add_parser("show")
    cc_show.add_argument("id", type=number, nargs="?")
    cc_destroy = ccp.add_parser("destroy")
    cc_destroy.add_argument("id", type=number)

    qp = sub.add_parser("qp", help="QPs: peer, state, RTO and retry budget").add_subparsers(
        dest="action", required=True, parser_class=_Parser
    )
    qp_show = qp.add_parser("show", help="every QP, or one")
    qp_show.add_argument("qpn", type=number, nargs="?")

    probe = sub.add_parser("probe", help="EV probe with RTT to a host (every plane by default)")
    probe.add_argument("host", type=host)
    probe.add_argument("--plane", type=number)
    probe.add_argument("--ev", type=number, help="EV value (default: T1 0 of the plane)")
    probe.add_argument("--timeout", type=float, default=1.0)
    return p


# Output ---------------------------------------------------------------------------------------
def table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    cells = [list(map(str, header)), *([str(c) for c in r] for r in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells
    )


def event_line(doc: dict[str, Any]) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(float(doc.get("time", 0))))
    dropped = f" events_dropped={doc['events_dropped']}" if doc.get("events_dropped") else ""
    return (
        f"{stamp} profile={doc['profile_id']} qpn={doc['qpn']} ev={doc['ev']:#x} "
        f"port={doc['port']} {doc['old_state']}->{doc['state']} reason={doc['reason']} "
        f"drops={doc['drop_count']}{dropped}"
    )


def show(args: argparse.Namespace, result: Any, human: str) -> None:
    print(
        json.dumps(result, indent=None if args.cmd == "ev" and args.what == "events" else 2)
        if args.json
        else human,
        flush=True,
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
                    r["qpn"],
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
                f"QPs: {' '.join(map(str, p['qps'])) or '-'}",
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


def run_qp(args: argparse.Namespace, ctl: Controller) -> int:
    qps = ctl.qps(args.qpn)
    rows = [
        (
            q["qpn"],
            q["state"],
            q["remote_host"] or "-",
            "-" if q["remote_qpn"] is None else q["remote_qpn"],
            q["writes_in_flight"],
            _ms(q["timeout"]),
            f"{q['linear_cnt']}+{q['exp_cnt']}",
            _ms(q.get("max_rto")),
            _ms(q.get("rto")),
            _ms(q.get("retry_budget")),
            q["failure"] or "",
        )
        for q in qps
    ]
    header = ("qpn", "state", "peer", "peer_qpn", "writes", "timeout_ms", "retries",
              "max_rto_ms", "rto_ms", "budget_ms", "failure")  # fmt: skip
    show(args, qps if args.qpn is None else qps[0], table(rows, header) if rows else "no QPs")
    return 0


def run_probe(args: argparse.Namespace, ctl: Controller) -> int:
    if args.ev is not None and args.plane is None:
        args.plane = addrplan.ev_fields(args.ev).plane
    if args.plane is not None:
        planes = [args.plane]
    else:
        planes = list(range(int(ctl.query_device()["planes"])))
    requests = [
        {
            "req_id": i,
            "host": args.host,
            "plane": p,
            "ev": args.ev if args.ev is not None else addrplan.ev_value(p, 0),
        }
        for i, p in enumerate(planes)
    ]
    r = ctl.ep_batch("ev_probe", requests, args.timeout)
    by_id = {req["req_id"]: req for req in requests}
    lines = [
        f"h{args.host} plane {x['port']} ev {by_id[x['req_id']]['ev']:#x}: "
        f"rtt {x['rtt'] * 1e3:.3f} ms via {x['via']}"
        + (f" (path {x['path']})" if x.get("path") else "")
        for x in r["responses"]
    ]
    lines += [f"h{args.host} request {k}: {v}" for k, v in r["errors"].items()]
    lines += [
        f"h{args.host} plane {by_id[i]['plane']}: no answer in {args.timeout} s"
        for i in r["timed_out"]
    ]
    show(args, r, "\n".join(lines))
    return 0 if not r["timed_out"] and not r["errors"] else 1


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        with Controller.open(args.socket) as ctl:
            return run(args, ctl)
    except UsageError as exc:
        sys.stderr.write(f"{PROG}: error: {exc}\n")
        return 2
    except ApiError as exc:
        sys.stderr.write(f"{PROG}: {exc}\n")
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())

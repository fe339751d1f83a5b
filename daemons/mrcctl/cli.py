"""mrcctl's command line: the parser, its argument types, and iproute2's habits.

As with ``ip``, an object given without an action shows it (``mrcctl port`` is ``mrcctl
port show``, ``mrcctl ev`` is ``mrcctl ev states``, ``mrcctl qp 0xbb2357`` is ``mrcctl qp
show 0xbb2357``), and plural names work (``ports``, ``evs``, ``qps``, ``profiles``).
:func:`normalize` rewrites the words before argparse sees them.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mrcstack import add_version_flag, addrplan
from mrcstack.fabric import parse_size
from mrcstack.qpn import parse_qpn
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


# Objects, their actions and aliases -------------------------------------------------------------
@dataclass(frozen=True)
class Noun:
    """An object of the command line: its actions, the one it does when none is given, and
    whether that default takes a number (``mrcctl qp 0xbb2357``)."""

    actions: tuple[str, ...] = ()
    default: str | None = None
    numbered: bool = False
    aliases: tuple[str, ...] = ()
    action_aliases: dict[str, str] = field(default_factory=dict)


NOUNS: dict[str, Noun] = {
    "caps": Noun(),
    "port": Noun(("show", "set", "notify"), "show", aliases=("ports",)),
    "ev": Noun(
        ("states", "format", "profile", "events"),
        "states",
        aliases=("evs",),
        action_aliases={"show": "states", "profiles": "profile", "formats": "format"},
    ),
    "cc": Noun(("profile",), "profile", action_aliases={"profiles": "profile"}),
    "qp": Noun(("show", "connect"), "show", numbered=True, aliases=("qps",)),
    "probe": Noun(aliases=("probes",)),
}
#: The second level: ``ev profile`` and ``cc profile`` show when given no action.
PROFILE = Noun(("create", "show", "set", "deny", "allow", "destroy"), "show", numbered=True)
CC_PROFILE = Noun(("create", "show", "destroy"), "show", numbered=True)
_GLOBAL_WITH_VALUE = {"--socket"}


def _is_number(word: str) -> bool:
    try:
        int(word, 0)
    except ValueError:
        return False
    return True


def _resolve(noun: Noun, words: list[str], at: int) -> int:
    """Put ``noun``'s action at ``words[at]``: its canonical name, or its default when no
    action is given; returns the index after it (len(words) when nothing follows)."""
    if noun.default is None:
        return at
    word = words[at] if at < len(words) else None
    if word is not None and word in noun.action_aliases:
        words[at] = noun.action_aliases[word]
        return at + 1
    if word is not None and word in noun.actions:
        return at + 1
    if word is None or (word.startswith("-") and word not in ("-h", "--help")):
        words.insert(at, noun.default)
        return at + 1
    if noun.numbered and _is_number(word):
        words.insert(at, noun.default)
    return at + 1


def normalize(argv: Sequence[str]) -> list[str]:
    """The words with plural objects made singular and missing actions filled in (iproute2:
    ``ip link`` is ``ip link show``).  Anything else is left for argparse to judge."""
    words = list(argv)
    at = 0
    while at < len(words) and words[at].startswith("-"):
        at += 2 if words[at] in _GLOBAL_WITH_VALUE else 1
    if at >= len(words):
        return words
    name = next((n for n, noun in NOUNS.items() if words[at] in (n, *noun.aliases)), None)
    if name is None:
        return words
    words[at] = name
    if _resolve(NOUNS[name], words, at + 1) > at + 1:
        second = {("ev", "profile"): PROFILE, ("cc", "profile"): CC_PROFILE}
        level = second.get((name, words[at + 1]))
        if level is not None:
            _resolve(level, words, at + 2)
    return words


# Argument types ---------------------------------------------------------------------------------
def number(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def hex_key(text: str) -> bytes:
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not hex digits: {text!r}") from None
    if len(key) not in (16, 32):
        raise argparse.ArgumentTypeError(f"an AES-GCM key is 16 or 32 bytes, got {len(key)}")
    return key


def qpn(text: str) -> int:
    try:
        return parse_qpn(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def host(text: str) -> int:
    m = re.fullmatch(r"h?(\d+)", text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(f"not a host (h3 or 3): {text!r}")
    return int(m.group(1))


def positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 s, got {text}")
    return value


def count(text: str) -> int:
    value = number(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


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


# The parser -------------------------------------------------------------------------------------
def _sub(parser: argparse.ArgumentParser, dest: str) -> Any:
    return parser.add_subparsers(dest=dest, required=True, parser_class=_Parser)


def _ev_profile_parsers(ev: Any) -> None:
    prof = _sub(ev.add_parser("profile", aliases=["profiles"], help="EV profiles"), "action")
    create = prof.add_parser("create", help="an explicit (--evs) or generated EV profile")
    create.add_argument("id", type=number, help="profile id")
    create.add_argument("--evs", type=ev_list, help="explicit EVs: VALUE[:PORT],...")
    for name in ("t1", "plane", "entropy"):
        create.add_argument(f"--{name}", type=span, help=f"generated: {name} range A-B")
    create.add_argument("--ev-count", type=number, help="EVs in the profile (generated)")
    create.add_argument("--min-active", type=number, help="ev_min_active: EVs kept usable")
    create.add_argument("--event-mask", help="states that raise EV events: good,assumed_bad,...")
    create.add_argument("--format", choices=EV_FORMATS, help="EV format (default srv6: uSID)")
    show = prof.add_parser("show", help="one profile with its EVs, or all (the default)")
    show.add_argument("id", type=number, nargs="?", help="profile id (default: all)")
    pmod = prof.add_parser("set", help="change ev_min_active / event mask online")
    pmod.add_argument("id", type=number, help="profile id")
    pmod.add_argument("--min-active", type=number, help="ev_min_active: EVs kept usable")
    pmod.add_argument("--event-mask", help="states that raise EV events: good,assumed_bad,...")
    pmod.add_argument("--format", choices=EV_FORMATS, help="EV format, while no QP uses it")
    for verb in ("deny", "allow"):
        d = prof.add_parser(verb, help=f"{verb} EVs of a profile (running QPs follow)")
        d.add_argument("id", type=number, help="profile id")
        d.add_argument("evs", type=number, nargs="+", help="EV values, like 0x102")
    destroy = prof.add_parser("destroy", help="remove an unused EV profile")
    destroy.add_argument("id", type=number, help="profile id")


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        description="MRC controller: ports, EV and CC profiles, EV states and events, QPs, "
        "probes.  An object without an action shows it (mrcctl port = mrcctl port show).",
    )
    add_version_flag(p)
    p.add_argument(
        "--socket", help="mrcd's API socket (default: $MRCD_SOCKET or the one in /run/mrcstack)"
    )
    p.add_argument("--json", action="store_true", help="print mrcd's answer as JSON")
    sub = _sub(p, "cmd")
    sub.add_parser("caps", help="controller capabilities (mrc_ctl_query_device)")

    port = _sub(sub.add_parser("port", aliases=["ports"], help="NIC ports (planes)"), "action")
    port.add_parser("show", help="admin and link state of every port (the default)")
    pset = port.add_parser("set", help="administratively enable or disable a port")
    pset.add_argument("port", type=number, help="port (plane), 0-based")
    pset.add_argument("state", choices=["up", "down"], help="up or down")
    notify = port.add_parser("notify", help="PORT_STATUS_UPDATE: tell a host which ports are up")
    notify.add_argument("host", type=host, help="the host to tell: h3 or 3")
    notify.add_argument("--status", type=number, help="port bitmap (default: the current one)")
    notify.add_argument("--timeout", type=float, default=1.0, help="seconds to wait (1)")

    ev = _sub(
        sub.add_parser("ev", aliases=["evs"], help="EV states (the default), format, profiles"),
        "what",
    )
    states = ev.add_parser("states", aliases=["show"], help="EV states of connected QPs")
    states.add_argument("--qp", type=qpn, help="one QP: 0xbb2357 or 12264279")
    states.add_argument("--profile", type=number, help="the QPs of one EV profile")
    fmt = ev.add_parser("format", help="EV format profiles: 0 srv6 (uSID), 1 srv6-srh, 2 stev")
    fmt.add_argument("id", type=number, nargs="?", help="one format profile (default: all)")
    _ev_profile_parsers(ev)
    events = ev.add_parser("events", help="EV events: recent ones, or a live stream")
    events.add_argument("--follow", action="store_true", help="stream events until interrupted")
    events.add_argument("--count", type=count, help="with --follow: stop after N new events")

    cc = _sub(sub.add_parser("cc", help="CC profiles (cc = cc profile show)"), "what")
    ccp = _sub(cc.add_parser("profile", aliases=["profiles"], help="CC profiles"), "action")
    cc_create = ccp.add_parser("create", help="NSCC parameters: base_rtt=100us max_cwnd=1MiB ...")
    cc_create.add_argument("id", type=number, help="profile id")
    cc_create.add_argument("--algorithm", default="nscc", help="CC algorithm (nscc)")
    cc_create.add_argument("params", nargs="*", metavar="NAME=VALUE", help="parameters")
    cc_show = ccp.add_parser("show", help="one CC profile, or all (the default)")
    cc_show.add_argument("id", type=number, nargs="?", help="profile id (default: all)")
    cc_destroy = ccp.add_parser("destroy", help="remove an unused CC profile")
    cc_destroy.add_argument("id", type=number, help="profile id")

    qp = _sub(
        sub.add_parser("qp", aliases=["qps"], help="QPs: peer, state, RTO and retry budget"),
        "action",
    )
    qp_show = qp.add_parser("show", help="every QP, or one (the default)")
    qp_show.add_argument("qpn", type=qpn, nargs="?", help="one QP: 0xbb2357 or 12264279")
    qp_conn = qp.add_parser(
        "connect", help="set an application's QP up out of band with a peer without mrcd"
    )
    qp_conn.add_argument("qpn", type=qpn, help="our QP (in reset): 0xbb2357 or 12264279")
    qp_conn.add_argument("--host", type=host, required=True, help="the peer's host")
    qp_conn.add_argument("--qpn", dest="remote_qpn", type=qpn, required=True,
                         help="the peer's QP number")  # fmt: skip
    qp_conn.add_argument("--psn", dest="remote_psn", type=number, required=True,
                         help="the peer's first PSN")  # fmt: skip
    qp_conn.add_argument("--key", type=hex_key, help="AES-GCM packet key (32 or 64 hex digits)")
    qp_conn.add_argument(
        "--extensions", action="store_true", help="with mrcstack's extension (a peer with mrcd)"
    )

    probe = sub.add_parser(
        "probe",
        aliases=["probes"],
        help="EV probes along one path per plane, with RTTs (like ping)",
        description="Probe HOST along one EV per plane (T1 0 of each, or --ev), -c times "
        "every -i seconds: a line per probe, then min/avg/max RTT and loss per plane and EV. "
        "Exit status 1 when a probed path never answered.",
    )
    probe.add_argument("host", type=host, help="the host to probe: h3 or 3")
    probe.add_argument("-c", "--count", type=count, default=1, help="probes per plane (1)")
    probe.add_argument(
        "-i", "--interval", type=positive, default=1.0, help="seconds between rounds (1)"
    )
    probe.add_argument("--plane", type=number, help="only this plane (default: every plane)")
    probe.add_argument(
        "--ev", type=number, help="EV value, like 0x102 (default: T1 0 of the plane)"
    )
    probe.add_argument(
        "--timeout", type=positive, default=1.0, help="seconds to wait for each answer (1)"
    )
    return p

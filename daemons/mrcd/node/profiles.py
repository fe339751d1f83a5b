"""EV format, EV and CC profiles: the node-wide state the controller API programs.

Vocabulary of ``mrc_ctl.h``.  The *EV format profile* says how an EV becomes the packet's
path: here it is fixed by the address plan (:mod:`mrcstack.addrplan`), an SRv6 uSID
destination, and profile 0 is the only one.  *EV profiles* are the EV sets QPs spray over
(explicit lists or generated from field ranges) with ``ev_count``, ``ev_min_active``, an
event mask and a DENY set; profile 0 is the address plan's default, generated per
destination.  *CC profiles* carry an algorithm and its NSCC parameters; profile 0 is NSCC
with the defaults.  QPs name their profiles by id (``QpAttr.ev_profile_id`` /
``cc_profile_id``); a profile in use cannot be replaced or destroyed (EBUSY).
"""

from __future__ import annotations

import dataclasses
import errno
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from mrcstack import addrplan
from mrcstack.api.errors import ApiError, invalid
from mrcstack.api.limits import U32, U64
from mrcstack.core import cc as cc_mod
from mrcstack.core.events import EvState
from mrcstack.core.evs import EvEntry, EvField, generate_evs
from mrcstack.core.reasons import EvReason
from mrcstack.daemons.mrcd import apiargs as a
from mrcstack.daemons.mrcd.datapath.transport import clock
from mrcstack.daemons.mrcd.node.qps import Qp, QpAttrs
from mrcstack.daemons.mrcd.node.workers.pool import DataPath
from mrcstack.fabric import LOCATOR_BLOCK_BITS, Fabric
from mrcstack.wire import EvFormat


class Node(Protocol):
    """What the profiles use of the node (:class:`.node.Node`, whose connection setup builds
    connections from them): its QPs, and the transport to wake when a QP's EVs change."""

    qps: dict[int, Qp]
    transport: DataPath | None


#: (remote host, a QP's EV set, its format) -> the EVs the link denylist denies.
LinkDenied = Callable[[int, tuple[EvEntry, ...], EvFormat], frozenset[int]]

MAX_EV_PROFILES = 256
MAX_CC_PROFILES = 256
EV_MAX_COUNT_PROFILE = 4096
EV_MAX_COUNT = MAX_EV_PROFILES * EV_MAX_COUNT_PROFILE
DEFAULT_EVENT_MASK = frozenset({EvState.GOOD, EvState.ASSUMED_BAD})
#: mrc_ctl.h's algorithm name for NSCC, next to the registry's own names.
CC_ALIASES = {"uet-1.0-nscc": "nscc"}
#: CC profile 0: NSCC aiming at 1 ms of queuing delay.  In a software endpoint most of the
#: delay NSCC measures is the hosts working through a window (sending a batch, the peer
#: reading its sockets), not switch queues: the core's default target (3/4 of the smallest
#: RTT, ~0.1 ms here) halves goodput on the testbed without keeping any switch queue
#: shorter.  Switch congestion still shows as ECN marks and trims.  For the same reason the
#: window may grow to 2 MiB (the core's default, 512 KiB, is the BDP of 4 x 100 Gbit/s at
#: 10 us): a software host's RTT under load is milliseconds, so 512 KiB kept one QP waiting
#: for ACKs; it starts at 512 KiB, as before.
DEFAULT_CC = cc_mod.CCParams(target_delay=1e-3, max_cwnd=2 << 20, initial_cwnd=512 << 10)
#: NSCC parameters of mrc_ctl_cc_nscc_cfg that our NSCC keeps as constants.
CC_FIXED = frozenset({"eta", "fi", "fi_scale", "gamma", "max_md_jump"})
CC_CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(cc_mod.CCParams))
#: The EV fields of the address plan's EV format (bit offset order).
EV_FORMAT_FIELDS = (
    ("t1", addrplan.EV_T1_BITS),
    ("plane", addrplan.EV_PLANE_BITS),
    ("entropy", addrplan.EV_ENTROPY_BITS),
)
REASON = EvReason.CONTROLLER
#: The EV format profiles, by the id an EV profile names (``fmt_profile_id``).
FORMATS_BY_ID = {0: EvFormat.SRV6, 1: EvFormat.SRV6_SRH, 2: EvFormat.STEV}
FORMAT_IDS = {fmt: ident for ident, fmt in FORMATS_BY_ID.items()}


@dataclass(slots=True)
class EvProfile:
    ident: int
    mode: str  # "generated" | "explicit"
    evs: tuple[EvEntry, ...] | None  # None: the address plan's default, per destination
    fields: tuple[EvField, ...]
    ev_count: int
    ev_min_active: int
    event_mask: frozenset[EvState] = DEFAULT_EVENT_MASK
    denied: set[int] = field(default_factory=set)
    fmt: EvFormat = EvFormat.SRV6  # its EV format profile: how the EVs reach the fabric

    def to_json(self, with_evs: bool) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "id": self.ident,
            "state": "online",
            "mode": self.mode,
            "fmt_profile_id": FORMAT_IDS[self.fmt],
            "format": self.fmt.value,
            "ev_count": self.ev_count,
            "ev_min_active": self.ev_min_active,
            "event_mask": sorted(s.value for s in self.event_mask),
            "fields": [
                {"name": f.name, "width": f.width, "min": f.min, "max": f.max, "mask": f.mask}
                for f in self.fields
            ],
            "denied": sorted(self.denied),
            "per_destination": self.evs is None,
        }
        if with_evs and self.evs is not None:
            doc["evs"] = [[e.value, e.port] for e in self.evs]
        return doc


@dataclass(frozen=True, slots=True)
class CcProfile:
    ident: int
    algorithm: str
    params: cc_mod.CCParams

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.ident,
            "state": "online",
            "algorithm": self.algorithm,
            "config": dataclasses.asdict(self.params),
        }


def _ev_fields() -> list[dict[str, Any]]:
    """Our EV layout (the same under every format): name, first bit, width."""
    out = []
    offset = 0
    for name, width in EV_FORMAT_FIELDS:
        out.append({"name": name, "offset": offset, "width": width})
        offset += width
    return out


class ProfileStore:
    """Every EV and CC profile of one node (profile 0 of each always exists)."""

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        default_fields = (
            EvField("t1", addrplan.EV_T1_BITS, 0, fabric.t1_per_plane - 1),
            EvField("plane", addrplan.EV_PLANE_BITS, 0, fabric.planes - 1),
            EvField("entropy", addrplan.EV_ENTROPY_BITS, 0, None),
        )
        self.ev: dict[int, EvProfile] = {0: EvProfile(0, "generated", None, default_fields, 128, 1)}
        self.cc: dict[int, CcProfile] = {0: CcProfile(0, "nscc", DEFAULT_CC)}
        #: (remote host, EV set, format) -> EVs the fabric mapper's link denylist denies
        #: (the node sets it): a new QP starts with them denied.
        self.link_denied: LinkDenied | None = None

    # Lookups ------------------------------------------------------------------------------
    def ev_profile(self, ident: int) -> EvProfile:
        profile = self.ev.get(ident)
        if profile is None:
            raise ApiError(errno.ENOENT, f"no EV profile {ident}")
        return profile

    def cc_profile(self, ident: int) -> CcProfile:
        profile = self.cc.get(ident)
        if profile is None:
            raise ApiError(errno.ENOENT, f"no CC profile {ident}")
        return profile

    def check_ids(self, ev_profile_id: int, cc_profile_id: int) -> None:
        self.ev_profile(ev_profile_id)
        self.cc_profile(cc_profile_id)

    def users(self, node: Node, *, ev: int | None = None, cc: int | None = None) -> list[int]:
        return [
            qpn
            for qpn, qp in node.qps.items()
            if (ev is not None and qp.attrs.ev_profile_id == ev)
            or (cc is not None and qp.attrs.cc_profile_id == cc)
        ]

    # What a connection is built with (for ConnectionSetup.ready) ---------------------------
    def config_fields(self, attrs: QpAttrs, local_host: int, remote_host: int) -> dict[str, Any]:
        """``ConnectionConfig`` keyword arguments the QP's profiles decide: the EV set
        (explicit, generated, or the address plan's for this destination), ``ev_count``,
        ``ev_min_active``, the DENY set, the profile id for EV events, the CC algorithm and
        its parameters.  ``ConnectionSetup.ready`` passes them as
        ``ConnectionConfig(**fields, ...)``."""
        ev = self.ev_profile(attrs.ev_profile_id)
        cc = self.cc_profile(attrs.cc_profile_id)
        evs = ev.evs
        if evs is None:
            evs = addrplan.ev_profile(self.fabric, local_host, remote_host, ev.ev_count)
        denied = frozenset(ev.denied)
        if self.link_denied is not None:
            denied |= self.link_denied(remote_host, evs, ev.fmt)
        return {
            "evs": evs,
            "ev_count": ev.ev_count,
            "ev_min_active": ev.ev_min_active,
            "denied": denied,
            "profile_id": ev.ident,
            "ev_format": ev.fmt,
            "cc": cc.algorithm,
            "cc_params": cc.params,
        }

    def denied_for(self, qp: Qp) -> frozenset[int]:
        """The controller's DENY set of the QP's EV profile."""
        profile = self.ev.get(qp.attrs.ev_profile_id)
        return frozenset(profile.denied) if profile is not None else frozenset()

    def apply_to_qp(self, node: Node, qpn: int) -> int:
        """Bring a connected QP's EV table in line with its profile (DENY set, min active).

        Idempotent; returns how many EV states changed.
        """
        qp = node.qps.get(qpn)
        if qp is None or qp.conn is None:
            return 0
        profile = self.ev.get(qp.attrs.ev_profile_id)
        if profile is None:
            return 0
        qp.conn.set_ev_min_active(profile.ev_min_active)
        now = clock()
        changed = qp.conn.deny_evs(profile.denied, now=now, reason=REASON)
        if changed and node.transport is not None:
            node.transport.kick(qpn)
        return changed

    # EV format profiles ---------------------------------------------------------------------
    def ev_format(self, ident: int = 0) -> dict[str, Any]:
        """EV format profile ``ident``: 0 SRv6 uSID, 1 SRv6 + SRH, 2 STEV (UDP/ECMP)."""
        fmt = FORMATS_BY_ID.get(ident)
        if fmt is None:
            ids = ", ".join(f"{i} ({f.value})" for i, f in FORMATS_BY_ID.items())
            raise ApiError(errno.ENOENT, f"no EV format profile {ident}: they are {ids}")
        if fmt is EvFormat.SRV6:
            return self._usid_format()
        if fmt is EvFormat.SRV6_SRH:
            return {
                "id": ident,
                "state": "online" if self.fabric.sid_format == "classic" else "offline",
                "mode": fmt.value,
                "srh": True,
                "locator_block": self.fabric.locator_block,
                "fields": [{"name": "segment", "width": 128}],
                "ev_fields": _ev_fields(),
                "ev_width": addrplan.EV_BITS,
                "layouts": {
                    "destination": "the first segment: the source T0's classic SID",
                    "segments": "T0(src) | T1(ev.t1) | T0(dst) | NIC(dst), each a 128-bit SID",
                    "classic_sid": "block | switch uSID | 0xe000 | 0...",
                },
            }
        return {
            "id": ident,
            "state": "online",
            "mode": fmt.value,
            "srh": False,
            "locator_block": self.fabric.locator_block,
            "fields": [
                {"name": "udp_source_port", "width": 16},
                {"name": "flow_label", "width": 20},
            ],
            "ev_fields": _ev_fields(),
            "ev_width": addrplan.EV_BITS,
            "layouts": {
                "destination": "the destination NIC's address, routed by ECMP",
                "udp_source_port": "0xc000 | EV bits 0-13",
                "flow_label": "EV bits 0-19",
            },
        }

    def _usid_format(self) -> dict[str, Any]:
        usids = [
            {"name": f"usid{i + 1}", "width": addrplan.USID_BITS} for i in range(addrplan.MAX_USIDS)
        ]
        ev_fields = _ev_fields()
        return {
            "id": 0,
            "state": "online",
            "mode": "srv6",
            "srh": False,
            "fields": [{"name": "locator_block", "width": LOCATOR_BLOCK_BITS}, *usids],
            "locator_block": self.fabric.locator_block,
            "ev_fields": ev_fields,
            "ev_width": addrplan.EV_BITS,
            "layouts": {
                "different_racks": (
                    "block | T0(src rack) | T1(ev.t1) | T0(dst rack) | NIC(dst) | 0 | 0"
                ),
                "same_rack": "block | T0(rack) | NIC(dst) | 0 | 0 | 0 | 0",
            },
            "usid_values": {
                "t0": "0x1000 | plane << 8 | rack",
                "t1": "0x2000 | plane << 8 | t1",
                "nic": "0x8000 | plane << 11 | host",
            },
        }

    # EV profiles ----------------------------------------------------------------------------
    def create_ev(self, node: Node, args: Mapping[str, Any]) -> EvProfile:
        ident = a.get_int(args, "id", 1, U64)
        if ident in self.ev:
            if self.users(node, ev=ident):
                raise ApiError(errno.EBUSY, f"EV profile {ident} is used by QPs")
        elif len(self.ev) >= MAX_EV_PROFILES:
            raise ApiError(errno.ENOMEM, f"at most {MAX_EV_PROFILES} EV profiles")
        mode = a.get_str(args, "mode", ("explicit", "generated"), "generated")
        if mode == "explicit":
            evs = self._explicit(a.get_list(args, "evs", EV_MAX_COUNT_PROFILE))
            fields: tuple[EvField, ...] = ()
        else:
            fields = self._fields(a.get_map(args, "fields"))
            count = 1
            for f in fields:
                count *= sum(1 for _ in f.values())
            if count > EV_MAX_COUNT_PROFILE:
                raise ApiError(
                    errno.E2BIG, f"fields generate {count} EVs, at most {EV_MAX_COUNT_PROFILE}"
                )
            try:
                evs = generate_evs(fields, port_field="plane")
            except ValueError as exc:
                raise invalid(f"fields: {exc}") from None
        if not evs:
            raise invalid("an EV profile needs at least one EV")
        ev_count = a.get_int(args, "ev_count", 1, len(evs), min(128, len(evs)))
        min_active = a.get_int(args, "ev_min_active", 0, ev_count, 1 if ev_count >= 1 else 0)
        profile = EvProfile(ident, mode, evs, fields, ev_count, min_active, self._mask(args))
        profile.fmt = self._format(args, EvFormat.SRV6)
        self.ev[ident] = profile
        return profile

    def _format(self, args: Mapping[str, Any], default: EvFormat) -> EvFormat:
        """The ``format`` argument (an EV format's name), or ``default``."""
        names = tuple(f.value for f in EvFormat)
        return EvFormat(a.get_str(args, "format", names, default.value))

    def _explicit(self, items: list[Any]) -> tuple[EvEntry, ...]:
        fabric = self.fabric
        out: list[EvEntry] = []
        seen: set[int] = set()
        for i, item in enumerate(items):
            if not (
                isinstance(item, list) and len(item) == 2 and all(type(x) is int for x in item)
            ):
                raise invalid(f"evs[{i}]: must be [value, port]")
            value, port = item
            if not 0 <= value <= U32 or not 0 <= port < fabric.planes:
                raise invalid(f"evs[{i}]: value must be 32-bit and port in 0..{fabric.planes - 1}")
            fields = addrplan.ev_fields(value)
            if fields.plane != port:
                raise invalid(
                    f"evs[{i}]: EV {value:#x} encodes plane {fields.plane}, not port {port}"
                )
            if fields.t1 >= fabric.t1_per_plane:
                raise invalid(
                    f"evs[{i}]: EV {value:#x} names T1 {fields.t1}; "
                    f"planes have {fabric.t1_per_plane}"
                )
            if value in seen:
                raise invalid(f"evs[{i}]: EV {value:#x} listed twice")
            seen.add(value)
            out.append(EvEntry(value, port))
        return tuple(out)

    def _fields(self, spec: Mapping[str, Any]) -> tuple[EvField, ...]:
        unknown = set(spec) - {name for name, _ in EV_FORMAT_FIELDS}
        if unknown:
            raise invalid(
                f"fields.{sorted(unknown)[0]}: not a field of the EV format (t1, plane, entropy)"
            )
        tops = {"t1": self.fabric.t1_per_plane - 1, "plane": self.fabric.planes - 1}
        out = []
        for name, width in EV_FORMAT_FIELDS:
            try:
                f = a.get_map(spec, name)
                top = tops.get(name, (1 << width) - 1)
                lo = a.get_int(f, "min", 0, top, 0)
                hi = a.get_int(f, "max", lo, top, top if name != "entropy" else 0)
                mask = a.get_opt_int(f, "mask", 0, (1 << width) - 1)
            except ApiError as exc:
                raise invalid(f"fields.{name}.{exc.message}") from None
            out.append(EvField(name, width, lo, hi, mask))
        return tuple(out)

    @staticmethod
    def _mask(args: Mapping[str, Any]) -> frozenset[EvState]:
        names = args.get("event_mask")
        if names is None:
            return DEFAULT_EVENT_MASK
        if not isinstance(names, list):
            raise invalid("event_mask: must be a list of EV states")
        try:
            return frozenset(EvState(n) for n in names)
        except ValueError:
            states = ", ".join(s.value for s in EvState)
            raise invalid(f"event_mask: states are {states}") from None

    def modify_ev(self, node: Node, args: Mapping[str, Any]) -> EvProfile:
        """Online changes: ``ev_min_active`` and ``event_mask`` (running QPs follow); the EV
        ``format`` only while no QP uses the profile (a connection keeps its format)."""
        profile = self.ev_profile(a.get_int(args, "id", 0, U64))
        if "format" in args:
            fmt = self._format(args, profile.fmt)
            if fmt is not profile.fmt and self.users(node, ev=profile.ident):
                raise ApiError(errno.EBUSY, f"EV profile {profile.ident} is used by QPs")
            profile.fmt = fmt
        if "ev_min_active" in args:
            profile.ev_min_active = a.get_int(args, "ev_min_active", 0, profile.ev_count)
            for qpn in self.users(node, ev=profile.ident):
                self.apply_to_qp(node, qpn)
        if "event_mask" in args:
            profile.event_mask = self._mask(args)
        return profile

    def destroy_ev(self, node: Node, ident: int) -> None:
        if ident == 0:
            raise invalid("EV profile 0 is the address plan's default and cannot be destroyed")
        self.ev_profile(ident)
        if self.users(node, ev=ident):
            raise ApiError(errno.EBUSY, f"EV profile {ident} is used by QPs")
        del self.ev[ident]

    def set_ev_state(self, node: Node, ident: int, values: list[int], deny: bool) -> int:
        """DENY (or allow again) EVs of a profile, on its running QPs too; returns the
        number of EV state changes on running QPs.  An allowed EV must prove itself with
        probes before carrying data (it returns as ASSUMED_BAD)."""
        profile = self.ev_profile(ident)
        if profile.evs is not None:
            known = {e.value for e in profile.evs}
            missing = [v for v in values if v not in known]
            if missing:
                raise ApiError(errno.ENOENT, f"EV {missing[0]:#x} is not in EV profile {ident}")
        if deny:
            profile.denied.update(values)
        else:
            profile.denied.difference_update(values)
        changed = 0
        now = clock()
        for qpn in self.users(node, ev=ident):
            conn = node.qps[qpn].conn
            if conn is None:
                continue
            hits = (conn.deny_evs if deny else conn.allow_evs)(values, now=now, reason=REASON)
            if hits and node.transport is not None:
                node.transport.kick(qpn)
            changed += hits
        return changed

    # CC profiles ----------------------------------------------------------------------------
    def create_cc(self, node: Node, args: Mapping[str, Any]) -> CcProfile:
        ident = a.get_int(args, "id", 1, U64)
        if ident in self.cc:
            if self.users(node, cc=ident):
                raise ApiError(errno.EBUSY, f"CC profile {ident} is used by QPs")
        elif len(self.cc) >= MAX_CC_PROFILES:
            raise ApiError(errno.ENOMEM, f"at most {MAX_CC_PROFILES} CC profiles")
        name = args.get("algorithm", "nscc")
        algorithm = CC_ALIASES.get(name, name) if isinstance(name, str) else None
        if algorithm not in cc_mod.REGISTRY:
            known = ", ".join(sorted({*cc_mod.REGISTRY, *CC_ALIASES}))
            raise invalid(f"algorithm: {name!r} is not one of {known}")
        config = a.get_map(args, "config")
        fixed = CC_FIXED & set(config)
        if fixed:
            raise invalid(f"config.{sorted(fixed)[0]}: a constant of our NSCC, not configurable")
        unknown = set(config) - set(CC_CONFIG_FIELDS)
        if unknown:
            raise invalid(
                f"config.{sorted(unknown)[0]}: unknown; "
                f"parameters are {', '.join(CC_CONFIG_FIELDS)}"
            )
        try:
            params = cc_mod.CCParams(**config)
        except (TypeError, ValueError) as exc:
            raise invalid(f"config: {exc}") from None
        profile = CcProfile(ident, algorithm, params)
        self.cc[ident] = profile
        return profile

    def destroy_cc(self, node: Node, ident: int) -> None:
        if ident == 0:
            raise invalid("CC profile 0 is the default and cannot be destroyed")
        self.cc_profile(ident)
        if self.users(node, cc=ident):
            raise ApiError(errno.EBUSY, f"CC profile {ident} is used by QPs")
        del self.cc[ident]
